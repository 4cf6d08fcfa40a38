"""experiments/ps_pull_timeline.py and ps_code_ab.py: the stored timeline is read back to the
numbers docs/ps.md quotes; the A/B script refuses a tree that is not a checkout and writes
its table from the jobs."""
from pathlib import Path

import pytest

from experiments import ps_code_ab
from experiments.ps_pull_timeline import analyse

STORED = Path(__file__).resolve().parents[2] / "docs/results/ps_pull_timeline"


def test_the_stored_colocated_timeline_reads_back(capsys):
    analyse(STORED / "coloc_tac_before", warmup=8)
    out = capsys.readouterr().out
    assert "pull_comm_s 35.7 ms" in out and "E 0.67" in out
    assert "a server issued at or before rank 0: 13 updates, median E 0.77, first bucket 207 Mbit/s" in out
    assert "every server after rank 0: 8 updates, median E 0.53, first bucket 281.5 Mbit/s" in out
    assert "forward end after the last pull landed: median 1.4 ms" in out


def test_ab_refuses_a_tree_that_is_not_a_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ps_code_ab.parse_args(["--a", str(tmp_path), "--b", str(tmp_path), "--out", "x"])
    assert "--a: expected a checkout of the project" in capsys.readouterr().err


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
    assert "| E of B: median (rounds) | 0.60 (0.60, 0.60, 0.60) | 0.60 (0.60, 0.60, 0.60) |" in md
