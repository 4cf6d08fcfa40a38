"""Synchronous pipelines (torch's schedules under caramel.pipeline) against single-process training."""
from __future__ import annotations

from caramel.testing import run_workers
from tests.strategies.pipeline import workers

STEPS = 10


def test_sync_schedules_match_single_process():
    ranks = run_workers(workers.sync_worker, 2, args=(STEPS,), timeout_s=150)
    for out in ranks:
        for name in ("gpipe", "1f1b", "interleaved", "1f1b_auto_adam"):
            assert out[name]["diff"] <= 1e-5, (name, out[name])
            assert out[name]["losses"][-1] < out[name]["losses"][0], (name, out[name]["losses"])
        assert out["reloaded"] == 0.0
    assert ranks[0]["1f1b"]["losses"] == ranks[1]["1f1b"]["losses"]  # the loss is on every rank
    assert ranks[0]["1f1b_auto_adam"]["boundaries"] == ranks[1]["1f1b_auto_adam"]["boundaries"]


def test_hybrid_two_stages_two_replicas_match_whole_batch():
    ranks = run_workers(workers.hybrid_worker, 4, args=(STEPS,), timeout_s=150)
    assert [r["layout"] for r in ranks] == [(0,), (0,), (1,), (1,)]
    for out in ranks:
        assert out["diff"] <= 1e-5, out
