"""experiments/pipeline_planner_buckets.py on the stored run V: without the option its row replays
to the bit of the prediction the bench recorded; with it, the planner's buckets are the replay's."""
from pathlib import Path

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
