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
    return run_workers(pace_worker, 2, args=(STEPS, SPECS, SLOW_S, (SCALE,)), timeout_s=180)


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
    biased if an update took the lr of the step at which it happened to be applied). The lr is
    read inside the optimizer's own step, and some updates are applied after the schedule has
    moved on (the optimizer's lr outside the server's step is another), so an update stepped at
    the current lr is caught."""
    late = 0
    for spec in SPECS:
        for rank in (0, 1):
            lrs, steps = runs[rank][spec]["step_lr"], runs[rank][spec]["server_steps"]
            assert len(set(lrs)) == STEPS  # the schedule moves every step
            assert steps and all(x["lr"] == lrs[x["step"]] for x in steps), (spec, rank, steps, lrs)
            late += sum(x["lr_now"] != lrs[x["step"]] for x in steps)
    assert late > 0
    # every rank applied (and pulled) each update once, over the re-plan after profiling
    assert all(runs[r][spec]["updates_applied"] == STEPS for r in (0, 1) for spec in SPECS)
    # each update stepped by some server: every step's lr was used
    assert {x["step"] for r in (0, 1) for x in runs[r][SCALE]["server_steps"]} == set(range(STEPS))


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
    with pytest.raises(CaramelError, match="staleness=scale does not combine with hierarchical=true .*; use "
                                           "hierarchical=false or staleness=none or pace"):
        PsOptions(consistency="ssp:2", staleness="scale", hierarchical=True)
    for consistency in ("ssp:1", "ssp_1"):  # lags are at most 1, which scale leaves alone: refused, not a no-op
        with pytest.raises(CaramelError, match=f"consistency={consistency} never has; use consistency=ssp:S with S >= 2"):
            PsOptions(consistency=consistency, staleness="scale")
    PsOptions(consistency="ssp:1", staleness="pace")  # pace and the others act at lag 1
    PsOptions(consistency="ssp:2", staleness="scale")
    PsOptions(consistency="asp", staleness="scale")


def test_scale_applies_a_gradient_tau_updates_old_at_lr_over_tau():
    """Four workers' pushes (gradient / 4) with lags 0, 1, 2 and 3, then the server's SGD step:
    Zhang et al.'s w - (1/4) sum_l lr / max(1, tau_l) g_l, computed by hand."""
    lr, w = 0.1, torch.tensor([1.0, -2.0])
    grads = [torch.tensor([0.3, 0.6]), torch.tensor([-0.9, 1.2]), torch.tensor([0.8, 0.4]), torch.tensor([1.5, -0.3])]
    parts = [g / 4 for g in grads]
    scaled(parts, [0, 1, 2, 3])
    stepped = w - lr * sum(parts)  # the server's SGD step on the sum
    # by hand: (0.3 - 0.9 + 0.8 / 2 + 1.5 / 3) / 4 = 0.3 / 4; (0.6 + 1.2 + 0.4 / 2 - 0.3 / 3) / 4 = 1.9 / 4
    want = torch.tensor([1.0 - 0.03 / 4, -2.0 - 0.19 / 4])
    assert torch.allclose(stepped, want, rtol=1e-6, atol=1e-7), (stepped, want)


def test_scale_divides_only_the_stale_gradients_without_pacing(runs):
    """Under ssp:2 with rank 1 slowed, rank 0 runs ahead (no pace); lr_scaled counts nothing
    under the other modes."""
    assert max(_lead(runs, SCALE)) > SLOW_S / 2 and runs[0][SCALE]["pace_wait_s"] == 0
    assert all(runs[r][spec]["lr_scaled"] == 0 for r in (0, 1) for spec in (PLAIN, PACE, PREDICT, COMPENSATE))


def test_scale_servers_step_each_workers_gradient_divided_by_its_own_lag(runs):
    """End to end on the servers' code path, SCALE with plain SGD: every lag a server reads is
    step - the version that worker's forward of that step used; each worker's part before the
    division is that worker's gradient / 2 (so a part is matched to its worker), after it the
    part / max(1, lag) (only parameters someone used); the gradient the server's optimizer steps
    is the sum of every worker's divided part, and the new value is w - lr * it. Lags of 2 occur
    (rank 0 runs ahead), so dropping or misplacing the division is caught; lr_scaled (summed
    over the ranks: each counts its own shard) equals the lags > 1 the servers read."""
    r = [runs[0][SCALE], runs[1][SCALE]]
    lags_of: dict[tuple[int, int], list[int]] = {}
    lag2 = scaled_parts = 0
    for rank in (0, 1):
        for entry in r[rank]["scale_log"]:
            u, ranks = entry["step"], entry["ranks"]
            assert ranks == [rank] + [j for j in (0, 1) if j != rank]
            for i, (lags, used, pre, post) in entry["params"].items():
                lags_of[(u, i)] = dict(zip(ranks, lags))
                for worker, lag, a, b in zip(ranks, lags, pre, post):
                    assert lag == u - r[worker]["version_at"][u][i], (rank, u, i, worker, lag)
                    assert 0 <= lag <= 2
                    np.testing.assert_array_equal(a, r[worker]["grad_at"][u][i] / np.float32(2))
                    np.testing.assert_array_equal(b, a / np.float32(max(1, lag)) if used else a)
                    lag2 += lag == 2 and used and bool(np.any(a != 0))
                    scaled_parts += lag > 1 and used
    assert lag2 > 0
    assert r[0]["lr_scaled"] + r[1]["lr_scaled"] == scaled_parts > 0
    stepped = 0
    for rank in (0, 1):
        for x in r[rank]["server_steps"]:
            u = x["step"]
            for i, (grad, before, after) in x["params"].items():
                want = sum(r[j]["grad_at"][u][i] / np.float32(2) / np.float32(max(1, u - r[j]["version_at"][u][i]))
                           for j in (0, 1))
                if (u, i) in lags_of:  # the servers' log and the workers' agree
                    assert lags_of[(u, i)] == {j: u - r[j]["version_at"][u][i] for j in (0, 1)}
                np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-9)
                np.testing.assert_allclose(after, before - np.float32(x["lr"]) * grad, rtol=1e-6, atol=1e-7)
                stepped += 1
    assert stepped == len(r[0]["grad_at"][0]) * STEPS  # every parameter, every update, by one server


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
