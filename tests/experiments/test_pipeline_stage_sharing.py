"""experiments/pipeline_stage_sharing.py: the refusals, the per-action excess over processor
sharing, and the summaries by model and by group (no replay: the scored tables come from the
stored runs, docs/results/pipeline_stage_sharing/)."""
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_a_run_without_host_sharing_and_an_unknown_built_on_are_refused():
    from experiments import pipeline_stage_sharing as script

    run_k = RESULTS / "pipeline_overlap" / "rendezvous" / "run_k"  # profiled all at once: nothing to spread
    with pytest.raises(SystemExit, match="run_k: its profile measured no host sharing"):
        script.score_run(str(run_k))
    with pytest.raises(SystemExit, match="--built-on 'run_x' names no run given; expected among run_k"):
        script.main([str(run_k), "--built-on", "run_x"])


def test_a_run_of_several_configurations_and_an_unknown_model_are_refused_as_such(tmp_path):
    from experiments import pipeline_stage_sharing as script
    from experiments import predict_saved_inputs

    for config in ("00-a", "01-b"):
        (tmp_path / "trace" / config).mkdir(parents=True)
        (tmp_path / "trace" / config / "prediction_inputs.json").write_text('{"profile": {"meta": {}}}')
    with pytest.raises(SystemExit, match="expected one trace configuration .*found 2"):
        script.score_run(str(tmp_path))
    # the argument named, not the profile; before any file is read
    with pytest.raises(predict_saved_inputs.RunError,
                       match="predict_run: sharing_model must be one of layout, stage or None .*got 'lane'"):
        predict_saved_inputs.predict_run(str(tmp_path), sharing_model="lane")


def test_each_action_is_set_against_processor_sharing_at_its_load():
    from experiments import pipeline_stage_sharing as script

    acts = [{"action": "F0", "slowdown": 2.0, "ranks_at_once": 1.0}, {"action": "F1", "slowdown": 1.5, "ranks_at_once": 3.0},
            {"action": "B0", "slowdown": 2.0, "ranks_at_once": 4.0},
            {"action": "B1", "slowdown": 3.0, "ranks_at_once": 3.0, "measured_ms": 12.0}]
    (out,) = script.action_excess([{"stage": 1, "actions": acts}], cores=2.0)
    # at or below 2 ranks the alone pace; 3 ranks on 2 cores 1.5x slower, 4 ranks 2x
    assert out == {"stage": 1, "first_forward": 2.0, "last_backward": 2.0, "others_mean": pytest.approx(1.0),
                   "last_backward_extra_ms": pytest.approx(6.0)}  # twice what sharing gives: half its 12 ms


def _row(run, built, errors, busy):
    return {"run": run, "built_on": built,
            **{m: {"error": e, "busy_errors": b} for m, e, b in zip(("layout", "stage"), errors, busy)}}


def test_the_summary_counts_steps_and_stages_per_model():
    from experiments import pipeline_stage_sharing as script

    rows = [_row("a", True, (0.05, -0.12), ([0.2, -0.05], [0.1, -0.05])),
            _row("b", False, (-0.02, 0.03), (None, None))]  # an unequal layout: no per-stage busy scored
    s = script.summary(rows)
    assert s["layout"]["step"] == {"n": 2, "median_abs": pytest.approx(0.035), "max_abs": 0.05, "within_10pct": 2}
    assert s["stage"]["step"]["within_10pct"] == 1 and s["stage"]["step"]["max_abs"] == 0.12
    assert s["layout"]["stage_busy"]["n"] == 2 and s["layout"]["stage_busy"]["within_10pct"] == 1
    assert s["stage"]["stage_busy"]["within_10pct"] == 2


def test_the_recommendation_is_the_fastest_predicted_row_against_the_measured_fastest(monkeypatch):
    import sys
    from types import SimpleNamespace

    from experiments import pipeline_stage_sharing as script

    def fake(run, model):  # the stage model predicts the pipeline faster than caramel, the layout model not
        pipe = 0.138 if model == "stage" else 0.141
        return [{"strategy": "caramel", "predicted_s": 0.140, "measured_s": 0.147},
                {"strategy": "pipeline:replicas=auto", "predicted_s": pipe, "measured_s": 0.136},
                {"strategy": "ddp", "predicted_s": None, "measured_s": 0.176}]  # not replayable: left out

    # the replays' module stood in for (importing it loads the bench's command line: seconds)
    monkeypatch.setitem(sys.modules, "predict_saved_inputs", SimpleNamespace(predict_run=fake))
    got = script.recommendations("run_x")
    assert got["layout"]["recommended"] == "caramel" and not got["layout"]["hit"]
    assert got["layout"]["off"] == pytest.approx(0.147 / 0.136 - 1)
    assert got["stage"] == {"recommended": "pipeline:replicas=auto", "predicted_s": 0.138, "measured_s": 0.136,
                            "fastest": "pipeline:replicas=auto", "fastest_s": 0.136, "off": 0.0, "hit": True}
