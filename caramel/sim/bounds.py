"""The best step time any schedule could reach for a profile's transfer windows.

Assumptions, all in the schedule's favour: perfect chunking and priority (communication is a
preemptible fluid at the collective's bandwidth cost, per parameter), no per-message latency,
no runtime overhead. Compute runs at the slowest worker's speed (it gates every collective).

With period T, a parameter's gradient is released at F + r_p (backward start plus its ready
time) and, with `overlap="forward"`, is due at T + u_p (its first use in the next forward; any
slack of a longer period is best spent before the next forward, which widens every window the
most). Windows of consecutive steps never overlap (every deadline is before the next backward),
so by the EDF feasibility condition on one preemptive channel the smallest feasible T is

    T* = max( C, W, max over releases a and uses u of [a + sum{w_p : r_p >= a, u_p <= u} - u] )

with C the compute time per step and W the communication work per step. With
`overlap="backward"` everything is due at backward end (then the optimizer runs); with
`overlap="none"` nothing overlaps: C + W.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from caramel.topology.spec import ClusterSpec
from caramel.profile.model_profile import ModelProfile
from caramel.sim.collectives import CommModel
from caramel.sim.workload import param_need_s, param_ready_s


@dataclass
class LowerBound:
    step_time_s: float
    compute_s: float  # C: forward + backward + optimizer on the slowest worker
    comm_s: float  # W: bandwidth time of every gradient, no latency
    window_s: float  # the window (EDF) term
    overlap: str

    def to_dict(self) -> dict:
        return asdict(self)


def lower_bound(profile: ModelProfile, cluster: ClusterSpec, overlap: str = "forward",
                comm: CommModel | None = None) -> LowerBound:
    """Best step time any plan could reach on `cluster` for `profile` (see module docstring)."""
    from caramel.sim.simulate import check_overlap  # one place that names the valid modes

    check_overlap(overlap)
    comm = comm or CommModel(cluster)
    slow = min(w.speed for w in cluster.workers)
    F = profile.forward_time_s / slow
    B = profile.backward_time_s / slow
    O = profile.optimizer_time_s / slow
    C = F + B + O
    ready = param_ready_s(profile)
    need = param_need_s(profile)
    idx = sorted(ready)
    r = np.array([F + ready[i] / slow for i in idx])
    u = np.array([need[i] / slow for i in idx])
    w = np.array([comm.transfer_s(profile.params[i].bytes) for i in idx])
    W = float(w.sum())
    if overlap == "none":
        return LowerBound(C + W, C, W, 0.0, overlap)
    if overlap == "backward":
        # every gradient due at backward end; EDF with one deadline = latest (release + later work)
        order = np.argsort(-r, kind="stable")
        tail = np.cumsum(w[order])  # work released at or after each release, latest first
        finish = float(np.max(r[order] + tail)) if len(r) else F
        window = max(finish, F + B) + O
        return LowerBound(max(C, window), C, W, window, overlap)
    window = _edf_period(r, u, w)
    return LowerBound(max(C, W, window), C, W, window, overlap)


def _edf_period(release: np.ndarray, use: np.ndarray, work: np.ndarray) -> float:
    """max over (a, u) of a + sum{w : release >= a, use <= u} - u, vectorized over uses."""
    if len(release) == 0:
        return 0.0
    by_use = np.argsort(use, kind="stable")
    u_sorted = use[by_use]
    best = -np.inf
    for a in np.unique(release):
        mask = (release[by_use] >= a).astype(float)
        csum = np.cumsum(work[by_use] * mask)
        # for ties in use, the cumulative sum at the last of the tied entries counts them all
        last_of_tie = np.r_[u_sorted[1:] != u_sorted[:-1], True]
        val = np.max((a + csum - u_sorted)[last_of_tie])
        best = max(best, float(val))
    return best
