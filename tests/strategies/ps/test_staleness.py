"""`ps:staleness=pace`: under ssp a worker ahead of the slowest waits for its push instead of
computing on older parameters; `staleness=predict` also extrapolates the parameters a forward
uses to the version its gradient is applied to; `staleness=compensate` corrects each stale
gradient at its server (DC-ASGD); `staleness=scale` applies a gradient tau updates old at
lr / tau (Zhang et al. 2016)."""
from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.parallelize import PROFILE_STEPS
from caramel.strategies.ps.staleness import scaled
from caramel.testing import run_workers
from tests.strategies.ps.ps_workers import pace_worker

STEPS = 8
SLOW_S = 0.12  # rank 1's sleep per step: far above any step's own work, even on a loaded machine
PLAIN, PACE = "ps:consistency=ssp:2", "ps:consistency=ssp:2,staleness=pace"
PREDICT = "ps:consistency=ssp:2,staleness=predict"
COMPENSATE = "ps:consistency=ssp:2,staleness=compensate"
SCALE = "ps:consistency=ssp:2,staleness=scale"
SPECS = (PLAIN, PACE, PREDICT, COMPENSATE, SCALE)


@pytest.fixture(scope="module")
def runs():
    return run_workers(pace_worker, 2, args=(STEPS, SPECS, SLOW_S), timeout_s=180)


def _lead(runs, spec: str) -> list[float]:
    """Per step t after the profiling steps: how long before the slowed rank 1 called step()
    for t - 1 the fast rank 0 began forward t (> 0: rank 0 ran ahead of the slowest worker)."""
    first = PROFILE_STEPS + 1
    return [runs[1][spec]["step_at"][t - 1] - runs[0][spec]["forward_at"][t] for t in range(first, STEPS)]


def test_pace_never_lets_a_worker_compute_ahead_of_the_slowest(runs):
    assert max(_lead(runs, PACE)) < 0, _lead(runs, PACE)
    assert max(_lead(runs, PLAIN)) > SLOW_S / 2  # without it rank 0 runs ahead
    assert runs[0][PACE]["pace_wait_s"] > SLOW_S and runs[0][PLAIN]["pace_wait_s"] == 0
    steady = slice(PROFILE_STEPS + 2, None)
    assert statistics.mean(runs[0][PACE]["staleness"][steady]) < statistics.mean(runs[0][PLAIN]["staleness"][steady])
    # the fast rank, once it has waited for the slow one, applies that step's update before its forward
    assert sum(runs[0][PACE]["paced"][PROFILE_STEPS + 1:]) > 0, runs[0][PACE]["paced"]


def test_every_rank_ends_equal(runs):
    for spec in SPECS:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0][spec]["params"], runs[1][spec]["params"])), spec


def test_every_update_runs_at_the_lr_of_the_step_that_made_it(runs):
    """The LR schedule moves per worker step (every rank steps it once a step), and update u
    is applied with step u's lr however late a server applies it, on every server and under
    every staleness mode: SSP and BSP follow one schedule (a measurement against BSP would be
    biased if an update took the lr of the step at which it happened to be applied)."""
    for spec in SPECS:
        for rank in (0, 1):
            lrs, applied = runs[rank][spec]["step_lr"], runs[rank][spec]["applied_lr"]
            assert len(set(lrs)) == STEPS  # the schedule moves every step
            assert applied and all(lr == lrs[u] for u, lr in applied), (spec, rank, applied, lrs)
    # each update applied by some server: every step's lr was used
    assert {u for r in (0, 1) for u, _ in runs[r][SCALE]["applied_lr"]} == set(range(STEPS))


def test_predict_runs_each_forward_on_the_extrapolated_parameters(runs):
    """A forward of step t uses w_v + (t - v) * (w_v - w_(v-1)) for a parameter at version v,
    with the true values w of each version as every rank observed them (not the engine's
    bookkeeping); the true values of a version are the same on both ranks."""
    true: dict[tuple[int, int], np.ndarray] = {}
    for rank in (0, 1):
        for seen in runs[rank][PREDICT]["seen"]:
            for i, (v, _t, _used, base) in seen.items():
                if (i, v) in true:
                    assert np.array_equal(true[(i, v)], base), (rank, i, v)
                true[(i, v)] = base
    checked = 0
    for rank in (0, 1):
        for seen in runs[rank][PREDICT]["seen"]:
            for i, (v, t, used, base) in seen.items():
                if t == v or (i, v - 1) not in true:
                    assert t > v or np.array_equal(used, base)
                    continue
                want = true[(i, v)] + (t - v) * (true[(i, v)] - true[(i, v - 1)])
                np.testing.assert_allclose(used, want, rtol=1e-5, atol=1e-6)
                checked += 1
    assert checked >= 20
    # the extrapolation changes what is learned, and synchronize() leaves every rank equal (checked above)
    assert any(not np.array_equal(a, b) for a, b in zip(runs[0][PREDICT]["params"], runs[0][PACE]["params"]))


def test_an_unknown_staleness_is_one_clear_error():
    with pytest.raises(CaramelError, match="staleness must be one of none, pace, predict, compensate"):
        PsOptions(consistency="ssp:2", staleness="lr")
    for consistency in ("bsp", "ssp:0"):  # nothing stale to correct: refused, not ignored
        with pytest.raises(CaramelError, match=f"consistency={consistency} never has"):
            PsOptions(consistency=consistency, staleness="pace")
    with pytest.raises(CaramelError, match="staleness=scale does not combine with hierarchical=true"):
        PsOptions(consistency="ssp:2", staleness="scale", hierarchical=True)


def test_scale_applies_a_gradient_tau_updates_old_at_lr_over_tau():
    """Three workers' pushes (gradient / 3) with lags 0, 1 and 3, then the server's SGD step:
    Zhang et al.'s w - (1/3) sum_l lr / max(1, tau_l) g_l, computed by hand."""
    lr, w = 0.1, torch.tensor([1.0, -2.0])
    grads = [torch.tensor([0.3, 0.6]), torch.tensor([-0.9, 1.2]), torch.tensor([1.5, -0.3])]
    parts = [g / 3 for g in grads]
    scaled(parts, [0, 1, 3])
    stepped = w - lr * (parts[0] + parts[1] + parts[2])  # the server's SGD step on the sum
    # by hand: (0.3 - 0.9 + 1.5 / 3) / 3 = -0.1 / 3; (0.6 + 1.2 - 0.3 / 3) / 3 = 1.7 / 3
    want = torch.tensor([1.0 + 0.01 / 3, -2.0 - 0.17 / 3])
    assert torch.allclose(stepped, want, rtol=1e-6, atol=1e-7), (stepped, want)


def test_scale_divides_only_the_stale_gradients_without_pacing(runs):
    """Under ssp:2 with rank 1 slowed, rank 0 runs ahead (no pace) and its lag-2 gradients are
    halved at the servers; every rank ends equal (checked above) on other values than plain ssp."""
    assert max(_lead(runs, SCALE)) > SLOW_S / 2 and runs[0][SCALE]["pace_wait_s"] == 0
    assert runs[0][SCALE]["lr_scaled"] + runs[1][SCALE]["lr_scaled"] > 0
    assert all(runs[r][spec]["lr_scaled"] == 0 for r in (0, 1) for spec in (PLAIN, PACE, PREDICT, COMPENSATE))
    assert any(not np.array_equal(a, b) for a, b in zip(runs[0][SCALE]["params"], runs[0][PLAIN]["params"]))


def test_compensate_applies_every_update_once_in_order_and_corrects_stale_gradients(runs):
    """Each server corrects each of its buckets once per update, in update order; the lags
    it reads stay within the bound, and every stale gradient finds the version it was computed
    at: for each worker's push, w_used is what that worker's forward of that step used (the
    drift is w_now less it; lag 0: w_now is it), so a wrong version, lag or worker is caught."""
    served_buckets = set()
    corrected = checked_stale = checked_fresh = 0
    for rank in (0, 1):
        dc = runs[rank][COMPENSATE]["dc"]
        assert dc["missing"] == 0, dc
        corrected += dc["corrected"]
        per_bucket: dict[int, list[int]] = {}
        workers = [rank] + [r for r in (0, 1) if r != rank]  # position j: the server's own push first
        for entry in dc["served"]:
            step, b = entry["step"], entry["bucket"]
            per_bucket.setdefault(b, []).append(step)
            assert all(0 <= lag <= 2 for lags in entry["lags"] for lag in lags), (rank, step, b, entry["lags"])
            for j, i, lag, now, drift in entry["drifts"]:
                used = runs[workers[j]][COMPENSATE]["dc"]["used_at"][step][i]
                if drift is None:
                    assert lag == 0 and np.array_equal(now, used), (rank, step, i, workers[j])
                    checked_fresh += 1
                else:
                    assert np.array_equal(drift, now - used), (rank, step, i, workers[j], lag)
                    checked_stale += 1
        for b, steps in per_bucket.items():
            assert steps == list(range(PROFILE_STEPS, STEPS)), (rank, b, steps)
        assert not served_buckets & set(per_bucket)
        served_buckets |= set(per_bucket)
    assert served_buckets == set(range(runs[0][COMPENSATE]["dc"]["buckets"]))
    assert corrected == checked_stale > 0 and checked_fresh > 0
    assert any(not np.array_equal(a, b) for a, b in zip(runs[0][COMPENSATE]["params"], runs[0][PACE]["params"]))
