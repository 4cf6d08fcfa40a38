"""experiments/balance_seed_steps.py: a step's split (the slow rank's nominal sleep taken out of
its compute, waits, the rest of the period) and the local batch from the share schedule, on a
hand-made two-rank trace; the pairs' ratios per seed, the pooled and seed-clustered t intervals
and the ANOVA on log ratios, the split's window past the trial, and the run directories' checks."""
import json
import math

import pytest


def _event(it, kind, lane, start, dur):
    return {"iteration": it, "kind": kind, "lane": lane, "name": kind, "start_s": start, "duration_s": dur, "rank": 0}


def _run_dir(path, samples_per_s, delay=0.001, iterations=8, trial_end=None, overlap="backward", wait0_s=0.01):
    """Two ranks, `iterations` iterations 0.1 s apart; shares [3, 1] then [2, 2] from batch 1."""
    path.mkdir()
    for rank in (0, 1):
        events = []
        for it in range(iterations):
            t = 10.0 + 0.1 * it
            events += [_event(it, "forward", "compute", t, 0.02), _event(it, "backward", "compute", t + 0.02, 0.03),
                       _event(it, "wait", "wait", t + 0.05, wait0_s if rank == 0 else 0.0),
                       _event(it, "optimizer", "compute", t + 0.06, 0.005)]
        (path / f"trace.rank{rank}.json").write_text(json.dumps({"events": events}))
    trial = None if trial_end is None else {"chosen": "caramel/" + overlap, "end_step": trial_end}
    summary = {"slow_worker": {"rank": 1, "delay_per_sample_s": delay, "compute_per_sample_per_rank_s": [0.002, 0.002]},
               "share_changes": [[0, [3, 1]], [1, [2, 2]]], "samples_per_s": samples_per_s,
               "median_step_time_s": 0.1, "val_loss": 0.5, "overlap": overlap, "overlap_trial": trial}
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


def test_the_pooled_and_seed_clustered_intervals_and_the_anova_read_log_ratios(tmp_path):
    """Two seeds, three pairs each: every statistic against scipy on the log ratios by hand."""
    from scipy import stats
    from experiments.balance_seed_steps import analyze
    ratios = {"s0": [1.25, 1.40, 1.31], "s3": [1.10, 1.50, 1.36]}
    for seed, rs in ratios.items():
        for rep, ratio in enumerate(rs):
            _run_dir(tmp_path / f"{seed}-r{rep}-equal", 100.0)
            _run_dir(tmp_path / f"{seed}-r{rep}-balanced", 100.0 * ratio)
    s = analyze(tmp_path)["summary"]
    logs = [math.log(x) for rs in ratios.values() for x in rs]
    mean, sd, t = sum(logs) / 6, stats.tstd(logs), stats.t.ppf(0.975, 5)
    assert s["pooled"]["geomean"] == pytest.approx(math.exp(mean))
    assert s["pooled"]["t95"] == pytest.approx([math.exp(mean - t * sd / 6 ** 0.5), math.exp(mean + t * sd / 6 ** 0.5)])
    by_seed = [[math.log(x) for x in rs] for rs in ratios.values()]
    means = [sum(g) / 3 for g in by_seed]
    t1, half = stats.t.ppf(0.975, 1), stats.tstd(means) / 2 ** 0.5
    assert s["seed_clustered"]["t95"] == pytest.approx([math.exp(sum(means) / 2 - t1 * half),
                                                        math.exp(sum(means) / 2 + t1 * half)])
    assert s["seed_anova_p"] == pytest.approx(stats.f_oneway(*by_seed).pvalue)
    assert s["pooled"]["at_least_1_3"] == 4 and s["by_seed"]["s3"]["at_least_1_3"] == 2


def test_the_split_starts_past_the_trial_unless_fewer_than_10_steps_are_left(tmp_path):
    from experiments.balance_seed_steps import MIN_SPLIT_STEPS, analyze_run
    _run_dir(tmp_path / "s0-r0-balanced", 100.0, iterations=30, trial_end=12)
    past = analyze_run(tmp_path / "s0-r0-balanced")
    assert past["split_from_step"] == 13 and past["split_steps"] == 30 - 13
    assert past["calibrated_per_rank_s"] == [0.002, 0.002]  # every rank's, as the summary names it
    _run_dir(tmp_path / "s0-r1-balanced", 100.0, iterations=30, trial_end=25)  # 4 steps past it: too few
    late = analyze_run(tmp_path / "s0-r1-balanced")
    assert 30 - 26 < MIN_SPLIT_STEPS and late["split_from_step"] == 1  # the final shares' first batch
    assert late["split_steps"] == 30 - 5  # the loop's 5 warm-up steps stay out


def test_the_step_split_medians_leave_out_forward_overlap_runs(tmp_path):
    from experiments.balance_seed_steps import analyze
    _run_dir(tmp_path / "s0-r0-equal", 100.0, wait0_s=0.01)
    _run_dir(tmp_path / "s0-r1-equal", 100.0, wait0_s=0.02)
    _run_dir(tmp_path / "s0-r2-equal", 100.0, wait0_s=0.03, overlap="forward")
    s = analyze(tmp_path)["summary"]["equal"]
    assert s["split_runs"] == 2 and s["split_left_out"] == ["s0-r2-equal"]
    assert s["rank0_wait_s_ms"] == pytest.approx(15.0)  # over all three runs: 20.0


def test_run_dirs_must_be_fresh_and_named_as_run_names_them(tmp_path):
    from experiments.balance_seed_steps import analyze, run_all
    with pytest.raises(SystemExit, match="distinct seeds"):
        run_all([0, 0], 1, tmp_path / "new", "caramel")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "s0-r0-equal").mkdir()
    with pytest.raises(SystemExit, match="new or empty directory"):
        run_all([0], 1, tmp_path / "old", "caramel")
    (tmp_path / "runs").mkdir()
    _run_dir(tmp_path / "runs" / "s0-r0-equal", 100.0)
    _run_dir(tmp_path / "runs" / "spare", 100.0)
    with pytest.raises(ValueError, match="spare"):
        analyze(tmp_path / "runs")
