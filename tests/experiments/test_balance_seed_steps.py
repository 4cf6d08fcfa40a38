"""experiments/balance_seed_steps.py: a step's split (the slow rank's nominal sleep taken out of
its compute, waits, the rest of the period) and the local batch from the share schedule, on a
hand-made two-rank trace; the pairs' ratios per seed."""
import json
import math

import pytest


def _event(it, kind, lane, start, dur):
    return {"iteration": it, "kind": kind, "lane": lane, "name": kind, "start_s": start, "duration_s": dur, "rank": 0}


def _run_dir(path, samples_per_s, delay=0.001):
    """Two ranks, eight iterations 0.1 s apart; shares [3, 1] then [2, 2] from batch 1."""
    path.mkdir()
    for rank in (0, 1):
        events = []
        for it in range(8):
            t = 10.0 + 0.1 * it
            events += [_event(it, "forward", "compute", t, 0.02), _event(it, "backward", "compute", t + 0.02, 0.03),
                       _event(it, "wait", "wait", t + 0.05, 0.01 if rank == 0 else 0.0),
                       _event(it, "optimizer", "compute", t + 0.06, 0.005)]
        (path / f"trace.rank{rank}.json").write_text(json.dumps({"events": events}))
    summary = {"slow_worker": {"rank": 1, "delay_per_sample_s": delay, "per_rank_s": [0.002, 0.002]},
               "share_changes": [[0, [3, 1]], [1, [2, 2]]], "samples_per_s": samples_per_s,
               "median_step_time_s": 0.1, "val_loss": 0.5, "overlap": "backward", "overlap_trial": None}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "run.json").write_text(json.dumps({"start": samples_per_s}))


def test_a_step_is_split_into_compute_sleep_wait_and_the_rest(tmp_path):
    from experiments.balance_seed_steps import shares_at, step_records
    _run_dir(tmp_path / "r", 100.0)
    changes = [[0, [3, 1]], [1, [2, 2]]]
    assert shares_at(changes, 0) == [3, 1] and shares_at(changes, 2) == [2, 2]
    fast = step_records(tmp_path / "r", 0, changes, 0.001, slow_rank=1)
    slow = step_records(tmp_path / "r", 1, changes, 0.001, slow_rank=1)
    assert [x["n"] for x in fast] == [3] + [2] * 7 and [x["n"] for x in slow] == [1] + [2] * 7
    assert fast[0]["compute_s"] == pytest.approx(0.055) and fast[0]["sleep_s"] == 0.0 and fast[0]["wait_s"] == 0.01
    assert fast[0]["period_s"] == pytest.approx(0.1) and fast[0]["other_s"] == pytest.approx(0.035)
    assert slow[1]["sleep_s"] == pytest.approx(0.002) and slow[1]["compute_s"] == pytest.approx(0.053)
    assert fast[-1]["period_s"] is None and fast[-1]["other_s"] is None  # the last iteration has no next start


def test_the_pairs_ratios_are_summarized_per_seed(tmp_path):
    from experiments.balance_seed_steps import analyze
    for name, sps in (("s0-r0-balanced", 130.0), ("s0-r0-equal", 100.0), ("s0-r1-balanced", 120.0),
                      ("s0-r1-equal", 100.0), ("s1-r0-balanced", 150.0), ("s1-r0-equal", 100.0)):
        _run_dir(tmp_path / name, sps)
    (tmp_path / "s1-r1-equal").mkdir()  # a run that failed before its summary: named, in no pair
    (tmp_path / "s1-r1-equal" / "run.json").write_text(json.dumps({"rc": 1}))
    out = analyze(tmp_path)
    assert out["failed_runs"] == ["s1-r1-equal"]
    assert out["ratios"] == pytest.approx({"s0-r0": 1.3, "s0-r1": 1.2, "s1-r0": 1.5})
    s = out["summary"]
    assert s["by_seed"]["s0"]["geomean"] == pytest.approx(math.sqrt(1.3 * 1.2))
    assert s["by_seed"]["s0"]["at_least_1_3"] == 1 and s["pooled"]["at_least_1_3"] == 2
    assert "seed_anova_p" not in s  # one seed with two pairs: nothing to compare
    assert s["balanced"]["rank0_wait_s_ms"] == pytest.approx(10.0) and s["equal"]["rank1_wait_s_ms"] == 0.0
