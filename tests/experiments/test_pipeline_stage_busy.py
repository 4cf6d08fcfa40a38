"""experiments/pipeline_stage_busy.py on the stored run S: the busy times and ratios quoted in
docs/pipeline.md and docs/results/pipeline_stage_busy/ come out of the script."""
from pathlib import Path

import pytest

RUN_S = Path(__file__).resolve().parents[2] / "docs" / "results" / "pipeline_profile_turns" / "run_s"
LAYER3 = "pipeline:microbatches=2,partition=layer3,replicas=2"
LAYER4 = "pipeline:microbatches=2,partition=layer4,replicas=2"


def test_run_s_busy_times_and_the_layer_pair():
    from experiments import pipeline_stage_busy as script

    hand = "pipeline:microbatches=4,replicas=2"
    run = script.replay_run(str(RUN_S), only=[hand, LAYER3])  # two rows replayed: the test's cost
    rows = {r["strategy"]: r for r in run["rows"]}
    assert set(rows) == {hand, LAYER3}
    # the timer's view adds stage 1's wait for its reduction in its first forward: 93.4 -> 102.5 ms
    # (measured: each rank's median busy time per step, as the bench reports it, meaned over the stage)
    assert [round(1e3 * t, 1) for t in rows[hand]["simulated_busy_s_per_lane"]] == [114.9, 93.4]
    assert [round(1e3 * t, 1) for t in rows[hand]["simulated_timed_s_per_lane"]] == [118.3, 102.5]
    assert [round(1e3 * t, 1) for t in rows[hand]["measured_busy_s_per_stage"]] == [117.0, 102.8]
    assert "partition=layer3" in rows[LAYER3]["layout"] and rows[LAYER3]["rank_stage"] == [0, 0, 1, 1]
    # every layout as run, from the record: the given layer3 row replays its own prediction
    assert rows[LAYER3]["predicted_s"] == pytest.approx(rows[LAYER3]["recorded_s"], rel=1e-9)
    pair = script.pair_ratio(run, LAYER3, LAYER4)
    assert round(pair["b_over_a_rounds"], 3) == 0.990 and [round(x, 3) for x in pair["ci95"]] == [0.970, 1.010]
    same = script.pair_ratio(run, LAYER4, "pipeline:replicas=auto,stages=auto")
    assert round(same["b_over_a_rounds"], 3) == 0.955 and [round(x, 3) for x in same["ci95"]] == [0.913, 0.998]
    with pytest.raises(SystemExit, match="no pipeline row 'pipeline:no-such-row' with runtime stats"):
        script.pair_ratio(run, LAYER3, "pipeline:no-such-row")
    no_rounds = {**run, "measured": {**run["measured"], LAYER4: {**run["measured"][LAYER4], "round_medians_s": None}}}
    with pytest.raises(SystemExit, match=f"row '{LAYER4}' has no positive round medians"):
        script.pair_ratio(no_rounds, LAYER3, LAYER4)
    # timer's view per stage: hand +1.2%, -0.4%; layer3 +21.5%, +11.9%
    totals = script.summary([run])["timed"]
    assert round(100 * totals["median_abs"], 2) == pytest.approx(6.52, abs=0.05) and totals["within_10pct"] == 2


def test_a_pair_must_name_two_rows():
    from experiments import pipeline_stage_busy as script

    with pytest.raises(SystemExit, match="two strategy names joined by '::'"):
        script.main([str(RUN_S), "--pair", LAYER3])
    # a name the run has no row for (here without stages=2 dropped as bench.json drops it) is refused, not skipped
    with pytest.raises(SystemExit, match="has no pipeline row 'pipeline:microbatches=2,partition=layer3,replicas=2,stages=2'"):
        script.main([str(RUN_S), "--pair", f"{LAYER3},stages=2::{LAYER4}"])


def test_a_pair_naming_a_row_without_runtime_stats_is_refused(tmp_path):
    import json

    from experiments import pipeline_stage_busy as script

    records = [{"strategy": LAYER3, "pipeline": {"stages": 2}}, {"strategy": LAYER4, "error": "failed"}]
    (tmp_path / "bench.json").write_text(json.dumps({"records": records}))
    with pytest.raises(SystemExit, match=f"has no pipeline row '{LAYER4}' with runtime stats"):
        script.main([str(tmp_path), "--pair", f"{LAYER3}::{LAYER4}"])
