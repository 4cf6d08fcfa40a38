"""experiments/ps_sim_score.py replays every stored ps row and keeps the rows the model was
built on apart from the rest."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = "docs/results/ps_sim_4workers_run1/bench.json"


def test_rows_are_replayed_marked_and_compared(monkeypatch):
    from experiments.ps_sim_score import compare, score

    monkeypatch.chdir(ROOT)
    rows = score([RUN], in_sample=[f"{RUN}:resnet18(b=8,width=16) x4 @ 480mbit"])
    assert [(r["strategy"], r["sample"]) for r in rows] == [("ps", "in"), ("ps:order=random", "in"), ("ps:order=tic", "in")]
    # bsp: the shared links never bind, so the replay is the run's own prediction (+9.9/+10.8/+9.4%)
    assert [round(100 * r["error"], 1) for r in rows] == [9.9, 10.8, 9.4]
    assert all(r["error"] == pytest.approx(r["recorded_error"], abs=1e-9) for r in rows)
    moved = [dict(r, predicted_s=r["measured_s"], error=0.0) for r in rows]
    table = compare({"code": "a", "rows": rows}, {"code": "b", "rows": moved})
    assert "| built on | 3 | 2 of 3 within 10%" in table and "3 of 3 within 10%" in table
    assert "| not built on | 0 | - | - |" in table
