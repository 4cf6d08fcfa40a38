"""experiments/pipeline_planner_buckets.py on the stored run V: without the option its row replays
to the bit of the prediction the bench recorded; with it, the planner's buckets are the replay's."""
from pathlib import Path

import pytest

RUN_V = Path(__file__).resolve().parents[2] / "docs" / "results" / "pipeline_reduce_cpu" / "run_v"
LAYER3 = "pipeline:microbatches=2,partition=layer3,replicas=2"


def test_run_v_replays_to_the_bit_without_the_option_and_in_the_planners_buckets_with_it():
    from experiments import pipeline_planner_buckets as script

    (row,) = script.score_run(str(RUN_V), only=[LAYER3], models=("layers", "planner"))
    assert row["layers"]["predicted_s"] == row["recorded_s"]  # the bench's own prediction, exactly
    # the layer model's 4 / 3 buckets; the planner's differ, and the engine's are in the trace
    assert row["layers"]["buckets_per_stage"] == [4, 3]
    assert row["planner"]["buckets_per_stage"] != [4, 3]
    assert row["engine_buckets_per_stage"] == [[5], [7]]
    assert row["planner"]["predicted_s"] != row["layers"]["predicted_s"]
    match = script.bucket_match([row])
    assert match["layers"]["stages"] == match["planner"]["stages"] == 2 and match["layers"]["equal"] == 0
    # a subset of the models summarises and tabulates as itself
    assert list(script.summary([row])) == ["layers", "planner"]
    table = script.markdown([row], {"v": script.summary([row])}, match, "cmd", "code")
    assert "| run | strategy | measured | layers | planner | busy measured" in table


def test_bad_models_and_a_run_without_a_trace_are_refused(tmp_path):
    from experiments import pipeline_planner_buckets as script

    with pytest.raises(SystemExit, match=r"models: 'engine' given; expected some of layers, planner"):
        script.score_run(str(RUN_V), models=("layers", "engine"))
    with pytest.raises(SystemExit, match=r"no trace/\*/prediction_inputs\.json"):
        script.score_run(str(tmp_path))
