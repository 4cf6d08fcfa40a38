"""experiments/ps_pull_timeline.py and ps_code_ab.py: the stored timelines are read back to the
numbers docs/ps.md quotes, its --poll-ms is checked; the A/B script refuses bad options with one
error each and writes its table from the jobs."""
from pathlib import Path

import pytest

from experiments import ps_code_ab
from experiments.ps_pull_timeline import analyse, parse_args

STORED = Path(__file__).resolve().parents[2] / "docs/results/ps_pull_timeline"


# the numbers docs/ps.md ("Pushes before pulls on each link") and ps_push_fifo_ab.md quote
QUOTED = {
    "coloc_tac_before": [
        "pull_comm_s 35.7 ms", "E 0.67",
        "every other server issued at or before rank 0: 13 updates, median E 0.77, first bucket 207 Mbit/s (178-269)",
        "some server issued after rank 0: 8 updates, median E 0.53, first bucket 281.5 Mbit/s (239-287), lag 0.4 to 11.6 ms",
        "forward end after the last pull landed: median 1.4 ms"],
    "coloc_tac_after": [
        "every other server issued at or before rank 0: 13 updates, median E 0.81, first bucket 205 Mbit/s (153-241)",
        "some server issued after rank 0: 8 updates, median E 0.70, first bucket 271.5 Mbit/s (252-286), lag 0.2 to 5.7 ms"],
    "hier_tac_before": [
        "E 0.54",
        "every other server issued at or before rank 0: 2 updates, median E 0.55, first bucket 78.0 Mbit/s (62-94)",
        "some server issued after rank 0: 19 updates, median E 0.54, first bucket 90 Mbit/s (45-96), lag 0.3 to 54.9 ms",
        "forward end after the last pull landed: median 4.8 ms"],
    "hier_tac_before2": [  # 64f501f again, in the same lock as hier_tac_after
        "E 0.53",
        "some server issued after rank 0: 19 updates, median E 0.53, first bucket 95 Mbit/s (70-96), lag 0.9 to 58.7 ms"],
    "hier_tac_after": [
        "makespan 123.3; E 0.82",
        "every other server issued at or before rank 0: 5 updates, median E 0.79",
        "some server issued after rank 0: 16 updates, median E 0.82, first bucket 93.0 Mbit/s (89-95), lag 0.7 to 5.0 ms"],
}


@pytest.mark.parametrize("name", sorted(QUOTED))
def test_the_stored_timelines_read_back_to_the_quoted_numbers(name, capsys):
    analyse(STORED / name, warmup=8)
    out = capsys.readouterr().out
    missing = [q for q in QUOTED[name] if q not in out]
    assert not missing, f"{name}: not in the analysis: {missing}\n{out}"
    assert "pushes_overlapping" not in out  # push landings are not measured (gloo p2p: only at wait())


@pytest.mark.parametrize("poll_ms", ["nan", "inf", "-inf", "-1"])
def test_the_timeline_refuses_a_poll_period_that_is_not_finite_and_nonnegative(poll_ms, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", f"--poll-ms={poll_ms}"])
    assert f"--poll-ms: expected finite milliseconds >= 0, got {float(poll_ms)}" in capsys.readouterr().err
    assert parse_args(["--out", "x", "--poll-ms", "0"]).poll_ms == 0.0  # the no-thread control


def test_ab_refuses_a_tree_that_is_not_a_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ps_code_ab.parse_args(["--a", str(tmp_path), "--b", str(tmp_path), "--out", "x"])
    assert "--a: expected a checkout of the project" in capsys.readouterr().err


@pytest.mark.parametrize("extra, expected", [
    (["--workers", "0"], "--workers: expected at least 2"),
    (["--nproc-per-node", "0"], "--nproc-per-node: expected at least 1"),
    (["--spec", "ps:order=tac"], "--spec: expected a spec without order="),
    (["--spec", "ddp"], "--spec: expected a ps spec"),
])
def test_ab_refuses_bad_options(extra, expected, capsys):
    checkout = str(Path(__file__).resolve().parents[2])
    with pytest.raises(SystemExit):
        ps_code_ab.parse_args(["--a", checkout, "--b", checkout, "--out", "x", *extra])
    assert expected in capsys.readouterr().err


def test_ab_refuses_a_job_with_the_wrong_step_count():
    ps_code_ab.check_steps({"step_s": [0.1] * 30}, 30, "round 0 a tac")
    with pytest.raises(SystemExit, match="round 0 a tac: expected 30 timed steps .* reported 29"):
        ps_code_ab.check_steps({"step_s": [0.1] * 29}, 30, "round 0 a tac")


def test_ab_table_from_jobs():
    per_round = 3
    runs = {t: {o: [] for o in ps_code_ab.ORDERS} for t in ps_code_ab.TREES}
    step = {("a", "random"): 0.12, ("a", "tac"): 0.11, ("b", "random"): 0.12, ("b", "tac"): 0.10}
    for r in range(3):
        for (t, o), s in step.items():
            runs[t][o].append({"step_s": [s * (1 + 0.01 * r)] * per_round, "E_median": 0.5 + 0.1 * (t == "b"), "S": 0.6})
    s = ps_code_ab.summarize(runs, per_round)
    assert s["b_over_a"]["tac"]["point"] == pytest.approx(1.1)
    assert s["b_over_a"]["random"]["point"] == pytest.approx(1.0)
    assert s["tac_over_random"]["b"]["point"] == pytest.approx(1.2)
    md = ps_code_ab.markdown({"what": "w", "command": "c", "trees": {"a": "x", "b": "y"}, "summary": s, "jobs": []})
    assert "| B over A (speed-up, 95% interval) | **1.000x**" in md and "| **1.100x**" in md
    assert ("| E of B: median of the meaningful rounds (rounds) | 0.60 (0.60, 0.60, 0.60) | 0.60 (0.60, 0.60, 0.60) |"
            in md)


def test_ab_e_median_leaves_out_the_rounds_where_e_means_nothing():
    # ps_first_pull_ab's B TAC rounds: 1.30 and 1.28 lie outside [0, 1] (`tictac.e_reading`)
    es, ss = [0.99, 0.83, 1.30, 0.76, 1.28, 0.83], [0.58, 0.73, 0.73, 0.81, 0.61, 0.88]
    assert ps_code_ab.e_cell(es, ss) == "0.83 over 4 of 6 (0.99, 0.83, 1.30, 0.76, 1.28, 0.83)"
    assert ps_code_ab.e_cell([0.7, 0.9], [0.6, 0.1]) == "0.70 over 1 of 2 (0.70, 0.90)"  # S under 0.2
    assert ps_code_ab.e_cell([1.2], [0.6]) == "none of 1 meaningful (1.20)"


def test_ab_says_which_s_each_tree_reports(tmp_path):
    checkout = Path(__file__).resolve().parents[2]
    assert ps_code_ab.s_is_median(checkout)  # this tree: `tictac.steady_medians`
    ps = tmp_path / "caramel" / "strategies" / "ps"
    ps.mkdir(parents=True)
    (ps / "run.py").write_text('"S": steady[-1]["S"],\n')  # a tree before the median S
    assert not ps_code_ab.s_is_median(tmp_path)
    runs = {t: {"tac": [{"step_s": [0.1], "E_median": 0.7, "S": 0.6}]} for t in ps_code_ab.TREES}
    md = ps_code_ab.markdown({"what": "w", "command": "c", "trees": {"a": "x", "b": "y"}, "orders": ["tac"],
                              "S_median_over_steps": {"a": False, "b": True},
                              "summary": ps_code_ab.summarize(runs, 1, ("tac",)), "jobs": []})
    assert "| S of A: median (each run's last step's) | 0.60 |" in md
    assert "| S of B: median (each run's median over E's steps) | 0.60 |" in md


def test_ab_with_tac_alone_reports_no_tac_over_random():
    per_round = 2
    runs = {t: {"tac": [{"step_s": [0.1 if t == "a" else 0.08] * per_round, "E_median": 0.7, "S": 0.6}] * 2}
            for t in ps_code_ab.TREES}
    s = ps_code_ab.summarize(runs, per_round, ("tac",))
    assert s["b_over_a"]["tac"]["point"] == pytest.approx(1.25) and "tac_over_random" not in s
    md = ps_code_ab.markdown({"what": "w", "command": "c", "trees": {"a": "x", "b": "y"}, "orders": ["tac"],
                              "summary": s, "jobs": []})
    assert "| | tac |" in md and "| **1.250x**" in md and "TAC over random" not in md


@pytest.mark.parametrize("orders", ["", "tac,tac", "fifo", "tac,tic"])
def test_ab_refuses_bad_orders(orders, capsys):
    checkout = str(Path(__file__).resolve().parents[2])
    with pytest.raises(SystemExit):
        ps_code_ab.parse_args(["--a", checkout, "--b", checkout, "--out", "x", "--orders", orders])
    assert "--orders: expected distinct orders among random, tac" in capsys.readouterr().err
    assert ps_code_ab.parse_args(["--a", checkout, "--b", checkout, "--out", "x", "--orders", "tac"]).orders == ("tac",)
