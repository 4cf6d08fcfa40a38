"""`ps:staleness=predict` and `compensate` resumed from a checkpoint: the fresh objects hold the
uninterrupted run's plan, step count and staleness state (each parameter's latest update, who
is the slowest; compensate: every server's running mean square), so the first forward that
lacks an update is extrapolated, and the first stale gradient corrected, as it would have
been; the run does not profile again (2-rank gloo)."""
from __future__ import annotations

import numpy as np
import pytest

from caramel.errors import CaramelError
from caramel.strategies.ps.parallelize import PROFILE_STEPS
from caramel.strategies.ps.resume import restore
from caramel.testing import run_workers
from tests.strategies.ps.ps_workers import predict_resume_worker

STEPS = 8
PREDICT = "ps:consistency=ssp:2,staleness=predict"
COMPENSATE = "ps:consistency=ssp:2,staleness=compensate"


@pytest.mark.timeout(150)
def test_a_resumed_predict_run_keeps_its_plan_steps_and_latest_updates():
    results = run_workers(predict_resume_worker, 2, args=(STEPS, PREDICT), timeout_s=140)
    for res in results:
        full, resumed = res["full_at"], res["resumed_at"]
        assert full["profiling"] == 0 and full["steps"] == STEPS // 2 and full["versions"] == [STEPS // 2]
        assert len(full["delta"]) == len(full["plan"]["params"])  # every parameter's latest update
        assert resumed.keys() == full.keys()
        for key in ("steps", "plan", "profiling", "versions", "peer_busy_s"):
            assert resumed[key] == full[key], key
        assert full["delta"].keys() == resumed["delta"].keys()
        assert all(np.array_equal(full["delta"][n], resumed["delta"][n]) for n in full["delta"])
        assert res["probe_moves"] > 0 and res["same_probe"]  # an extrapolation happened, the same one
        # the resumed run goes on with that plan (no profiling steps) to the same step count
        assert res["resumed_profiled"] == 0 and res["resumed_end_steps"] == STEPS
        assert res["resumed_end_plan"] == res["full_end_plan"]
        assert res["older"] == {"profiling": PROFILE_STEPS, "steps": 0}  # no entry: loads, profiles as before
    assert all(np.array_equal(a, b) for a, b in zip(results[0]["params"], results[1]["params"]))


def _union(parts: list[dict]) -> dict:
    out: dict = {}
    for part in parts:
        assert not out.keys() & part.keys()  # one server per parameter
        out.update(part)
    return out


@pytest.mark.timeout(150)
def test_a_resumed_compensate_run_keeps_every_servers_running_mean_square():
    """Saved from every server at synchronize(), each server gets its own back bit for bit;
    the new plan after profiling takes them over too (the servers change)."""
    results = run_workers(predict_resume_worker, 2, args=(STEPS, COMPENSATE), timeout_s=140)
    for res in results:
        full, resumed = res["full_at"], res["resumed_at"]
        for key in ("steps", "plan", "profiling", "versions", "peer_busy_s", "served"):
            assert resumed[key] == full[key], key
        assert full["dc_mean_sq"].keys() == resumed["dc_mean_sq"].keys() <= set(full["served"])
        for n, m in full["dc_mean_sq"].items():
            assert m.dtype == np.float32 and np.array_equal(m, resumed["dc_mean_sq"][n]), n
        assert res["resumed_profiled"] == 0 and res["resumed_end_steps"] == STEPS
        # the first correction after the resume point is the uninterrupted run's, bit for bit (a
        # made-up push: which pushes are stale in the run depends on timing), and depends on the state
        assert res["probed"] == len(full["dc_mean_sq"]) and res["same_probe"] and res["probe_needs_state"]
        assert len(res["replans"]) == 1
        assert res["replans"][0]["after"].keys() <= set(full["served"])  # the plan at the resume point is that one
    every = _union([r["full_at"]["dc_mean_sq"] for r in results])
    assert every.keys() == set(results[0]["full_at"]["served"]) | set(results[1]["full_at"]["served"])
    before = _union([r["replans"][0]["before"] for r in results])
    after = _union([r["replans"][0]["after"] for r in results])
    assert before and before.keys() == after.keys()
    assert all(np.array_equal(before[n], after[n]) for n in before)
    assert any(before[n].shape != () for n in before)
    assert all(np.array_equal(a, b) for a, b in zip(results[0]["params"], results[1]["params"]))


class _Run:
    class groups:  # noqa: N801 - the attribute a PsRun has
        dedicated: list = []


def test_a_newer_entry_is_one_clear_error():
    with pytest.raises(CaramelError, match="'caramel_ps' has version 2, newer than this caramel reads"):
        restore(_Run(), {"version": 2})
