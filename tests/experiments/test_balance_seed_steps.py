"""experiments/balance_seed_steps.py: a step's split (the slow rank's nominal sleep taken out of
its compute, waits, the rest of the period) and the local batch from the share schedule, on a
hand-made two-rank trace; the pairs' ratios per seed, the pooled and seed-clustered t intervals
and the ANOVA on log ratios, the split's window past the trial, and the run directories' checks;
two checkouts side by side (`run --code`): the parsing, the run order and the A/B analysis."""
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
    from experiments.balance_seed_steps import write_run_meta
    write_run_meta(path, {"start": samples_per_s})  # tagged; the A/B test's are untagged, as before the tag


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


def test_code_pairs_are_parsed_and_checked(tmp_path):
    from experiments.balance_seed_steps import parse_codes
    for name in ("old", "new"):
        (tmp_path / name / "caramel").mkdir(parents=True)
        (tmp_path / name / "caramel" / "__init__.py").write_text("")
    assert parse_codes([]) == {}
    assert parse_codes([f"old={tmp_path / 'old'}", f"new={tmp_path / 'new'}"]) == {"old": tmp_path / "old",
                                                                                    "new": tmp_path / "new"}
    for specs, match in (([f"old={tmp_path / 'old'}"], "expected none or two"),
                         ([f"old={tmp_path / 'old'}", f"old={tmp_path / 'new'}"], "given twice"),
                         ([f"old={tmp_path / 'old'}", f"b-c={tmp_path / 'new'}"], "NAME=CHECKOUT"),
                         ([str(tmp_path / "old")], "NAME=CHECKOUT"),
                         ([f"old={tmp_path / 'old'}", f"new={tmp_path}"], "no caramel package")):
        with pytest.raises(SystemExit, match=match):
            parse_codes(specs)


def test_two_codes_alternate_with_one_equal_run_per_seed_between_them():
    from experiments.balance_seed_steps import run_plan
    assert [n for n, _, _ in run_plan([0, 1], 2, ["old", "new"])] == [
        "s0-r0-balanced-old", "s0-r0-equal", "s0-r0-balanced-new",
        "s1-r0-balanced-new", "s1-r0-equal", "s1-r0-balanced-old",
        "s0-r1-balanced-new", "s0-r1-balanced-old", "s1-r1-balanced-old", "s1-r1-balanced-new"]
    assert run_plan([0], 1, []) == [("s0-r0-balanced", "balanced", None), ("s0-r0-equal", "equal", None)]


def test_two_codes_are_compared_pair_by_pair_and_against_their_seeds_equal_run(tmp_path):
    from experiments.balance_seed_steps import analyze
    sps = {("s0", "r0"): (130.0, 143.0), ("s0", "r1"): (120.0, 120.0), ("s1", "r0"): (150.0, 135.0)}
    for (seed, rep), (old, new) in sps.items():
        _run_dir(tmp_path / f"{seed}-{rep}-balanced-old", old)
        _run_dir(tmp_path / f"{seed}-{rep}-balanced-new", new)
    for seed in ("s0", "s1"):
        _run_dir(tmp_path / f"{seed}-r0-equal", 100.0)
    for d in tmp_path.iterdir():  # the equal runs ran under the old checkout: it is the base
        root = "/new" if d.name.endswith("-new") else "/old"
        (d / "run.json").write_text(json.dumps({"start": 0.0, "code": root[1:], "code_root": root}))
    out = analyze(tmp_path)
    assert (out["base"], out["other"]) == ("old", "new")
    assert out["ratios"]["new/old"] == pytest.approx({"s0-r0": 1.1, "s0-r1": 1.0, "s1-r0": 0.9})
    assert out["ratios"]["old"] == pytest.approx({"s0-r0": 1.3, "s0-r1": 1.2, "s1-r0": 1.5})
    assert out["summary"]["new"]["pooled"]["at_least_1_3"] == 2 and out["ab"]["faster"] == 1
    assert out["ab"]["geomean"] == pytest.approx((1.1 * 1.0 * 0.9) ** (1 / 3))
    assert out["ab"]["by_seed"] == pytest.approx({"s0": 1.1 ** 0.5, "s1": 0.9})
    assert out["settle"]["old"]["last_change_batch"] == [1, 1, 1] and out["settle"]["new"]["reversals"] == [0, 0, 0]


def test_a_change_scheduled_past_the_runs_end_is_not_its_final_shares(tmp_path):
    from experiments.balance_seed_steps import analyze_run
    _run_dir(tmp_path / "s0-r0-balanced", 100.0, iterations=8)
    summary = json.loads((tmp_path / "s0-r0-balanced" / "summary.json").read_text())
    summary["share_changes"].append([8, [1, 3]])
    summary["end_step"] = 8
    (tmp_path / "s0-r0-balanced" / "summary.json").write_text(json.dumps(summary))
    run = analyze_run(tmp_path / "s0-r0-balanced")
    assert run["final_shares"] == [2, 2] and run["final_from_batch"] == 1 and run["changes_past_end"] == [[8, [1, 3]]]


def test_reversals_count_turns_of_rank_0s_share():
    from experiments.balance_seed_steps import reversals
    assert reversals([[0, [128, 128]], [10, [170, 86]], [20, [180, 76]]]) == 0
    assert reversals([[0, [128, 128]], [10, [180, 76]], [50, [161, 95]], [90, [181, 75]]]) == 2


def test_run_json_is_tagged_old_untagged_folders_read_and_foreign_files_are_refused(tmp_path):
    from caramel.errors import FormatError
    from experiments.balance_seed_steps import read_run_meta, write_run_meta
    meta = {"cmd": ["caramel", "train"], "code": "abc", "code_root": "", "rc": 0, "start": 1.0, "end": 2.0, "tail": ""}
    write_run_meta(tmp_path, meta)
    assert json.loads((tmp_path / "run.json").read_text())["format"] == "caramel.balance-seed-run/1"
    assert read_run_meta(tmp_path) == {"format": "caramel.balance-seed-run/1", **meta}
    assert read_run_meta(tmp_path / "none") == {}
    (tmp_path / "run.json").write_text(json.dumps(meta))  # a folder from before the tag
    assert read_run_meta(tmp_path) == meta
    for foreign in ({"rc": 0, "events": []}, [1], {"format": "caramel.plan/1"}, {"format": "caramel.balance-seed-run/9"}):
        (tmp_path / "run.json").write_text(json.dumps(foreign))
        with pytest.raises(FormatError, match="run.json"):
            read_run_meta(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(FormatError, match="run.json: not JSON"):
        read_run_meta(tmp_path)
