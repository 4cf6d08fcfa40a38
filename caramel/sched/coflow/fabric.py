"""The shared fabric: coflows on a non-blocking switch, served in a priority order.

Between two events (a release or a coflow's finish) rates are fixed. A priority order over the
released coflows sets them as Varys does: in order, each coflow gets the rates that finish all
its flows together at its bottleneck port given what higher-priority coflows left (MADD); what is
still free then goes, in the same order, to any flow that can use it (work conservation).
`FabricSim` advances event by event under an order chosen at each event (the environment's
step); `simulate` runs a whole workload under one scheduler function.
"""
from __future__ import annotations

import copy
import dataclasses
import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np

from caramel.errors import CaramelError
from caramel.sched.coflow.workload import Workload

DONE_FRACTION = 1e-9  # a flow with this little of its bytes left is done (float rounding)


def allocate(order: list[int], remaining: list[np.ndarray], workload: Workload) -> dict[int, np.ndarray]:
    """Per-flow rates (bytes/s) of the coflows in `order`, highest priority first (MADD, then
    work conservation in the same order)."""
    bw = workload.port_bandwidth_Bps
    up = np.full(workload.num_ports, bw)
    down = np.full(workload.num_ports, bw)
    rates = {c: np.zeros(len(remaining[c])) for c in order}
    for c in order:
        flows, left = workload.coflows[c].flows, remaining[c]
        need_up = np.zeros(workload.num_ports)
        need_down = np.zeros(workload.num_ports)
        for f, b in zip(flows, left):
            need_up[f.src] += b
            need_down[f.dst] += b
        used = (need_up > 0) | (need_down > 0)
        if not used.any():
            continue
        cap_up, cap_down = up[need_up > 0], down[need_down > 0]
        if (cap_up <= 0).any() or (cap_down <= 0).any():
            continue  # a port it needs is taken by higher priorities; backfill below may still help
        gamma = max((need_up[need_up > 0] / cap_up).max(), (need_down[need_down > 0] / cap_down).max())
        for i, (f, b) in enumerate(zip(flows, left)):
            if b > 0:
                r = b / gamma
                rates[c][i] = r
                up[f.src] -= r
                down[f.dst] -= r
        np.maximum(up, 0, out=up)
        np.maximum(down, 0, out=down)
    for c in order:  # work conservation
        for i, (f, b) in enumerate(zip(workload.coflows[c].flows, remaining[c])):
            extra = min(up[f.src], down[f.dst])
            if b > 0 and extra > 0:
                rates[c][i] += extra
                up[f.src] -= extra
                down[f.dst] -= extra
    return rates


class FabricSim:
    """The workload's state: released coflows, bytes left, finish times; advanced by `advance`."""

    def __init__(self, workload: Workload):
        self.workload = workload
        n = len(workload.coflows)
        self.now_s = 0.0
        self.remaining = [np.array([f.bytes for f in c.flows], dtype=float) for c in workload.coflows]
        self.released_s = np.full(n, np.nan)
        self.finished_s = np.full(n, np.nan)
        self.children: list[list[int]] = [[] for _ in range(n)]
        self.waiting = np.zeros(n, dtype=int)  # unfinished dependencies
        for c in workload.coflows:
            self.waiting[c.id] = len(c.deps)
            for d in c.deps:
                self.children[d].append(c.id)
        self._releases: list[tuple[float, int]] = []
        for job in workload.jobs:
            for cid in job.coflows:
                if not workload.coflows[cid].deps:
                    heapq.heappush(self._releases, (job.arrival_s + workload.coflows[cid].delay_s, cid))
        self.active: list[int] = []  # released, unfinished, in release order
        self._release_due()
        if not self.active and self._releases:
            self.now_s = self._releases[0][0]
            self._release_due()

    @property
    def done(self) -> bool:
        return not self.active and not self._releases

    def clone(self) -> "FabricSim":
        """An independent copy of the state (the workload shared): to try a choice and run on."""
        c = copy.copy(self)
        c.remaining = [r.copy() for r in self.remaining]
        c.released_s, c.finished_s, c.waiting = self.released_s.copy(), self.finished_s.copy(), self.waiting.copy()
        c._releases, c.active = list(self._releases), list(self.active)
        return c

    def arrived_jobs(self) -> list[int]:
        """The jobs that have arrived by now: their DAGs are known; later jobs' are not."""
        return [j.id for j in self.workload.jobs if j.arrival_s <= self.now_s]

    def restricted(self, jobs: list[int]) -> tuple["FabricSim", list[int]]:
        """The state of `jobs` alone, and the full coflow id of each of its coflows: a simulation
        over a workload of only their coflows (jobs and coflows renumbered in order), with their
        bytes left, releases due and finishes. Nothing of the other jobs is carried over, so a
        decision made on it cannot depend on them (the online check's causality)."""
        w = self.workload
        keep = sorted(set(jobs))
        job_index = {j: i for i, j in enumerate(keep)}
        ids = sorted(c for j in keep for c in w.jobs[j].coflows)
        new = {c: i for i, c in enumerate(ids)}  # monotone: ties in the heuristics' orders break alike
        coflows = []
        for c in ids:
            co = w.coflows[c]
            if any(d not in new for d in co.deps):
                raise CaramelError(f"coflow {c} of job {co.job} depends on {co.deps}, outside jobs {keep}; "
                                   f"a restricted state needs every dependency inside it")
            coflows.append(dataclasses.replace(co, id=new[c], job=job_index[co.job],
                                               deps=tuple(new[d] for d in co.deps)))
        view = copy.copy(self)
        view.workload = Workload(w.num_ports, w.port_bandwidth_Bps, tuple(
            dataclasses.replace(w.jobs[j], id=job_index[j], coflows=tuple(new[c] for c in w.jobs[j].coflows))
            for j in keep), tuple(coflows))
        view.remaining = [self.remaining[c].copy() for c in ids]
        view.released_s, view.finished_s, view.waiting = (a[ids].copy() for a in
                                                          (self.released_s, self.finished_s, self.waiting))
        view.children = [[new[x] for x in self.children[c] if x in new] for c in ids]
        view._releases = [(t, new[c]) for t, c in self._releases if c in new]
        heapq.heapify(view._releases)
        view.active = [new[c] for c in self.active if c in new]
        return view, ids

    def _release_due(self) -> None:
        while self._releases and self._releases[0][0] <= self.now_s:
            _, cid = heapq.heappop(self._releases)
            self.released_s[cid] = self.now_s
            self.active.append(cid)

    def advance(self, order: list[int]) -> float:
        """Serve the active coflows in `order` (a permutation of `active`) until the next event;
        returns the time that passed. With nothing active, jumps to the next release."""
        if sorted(order) != sorted(self.active):
            raise CaramelError(f"order {order} must list every active coflow {sorted(self.active)} once")
        start = self.now_s
        if not self.active:
            if not self._releases:
                return 0.0
            self.now_s = self._releases[0][0]
            self._release_due()
            return self.now_s - start
        rates = allocate(order, self.remaining, self.workload)
        dt = min((self._releases[0][0] - self.now_s) if self._releases else np.inf,
                 min((float((self.remaining[c][r > 0] / r[r > 0]).min()) for c, r in rates.items() if (r > 0).any()),
                     default=np.inf))
        if not np.isfinite(dt):
            raise CaramelError("no coflow can progress and nothing is due: the fabric is stuck")
        self.now_s += dt
        finished = []
        for c, r in rates.items():
            left = self.remaining[c]
            left -= r * dt
            sizes = np.array([f.bytes for f in self.workload.coflows[c].flows])
            left[left <= DONE_FRACTION * sizes] = 0.0
            if not left.any():
                finished.append(c)
        for c in finished:
            self.active.remove(c)
            self.finished_s[c] = self.now_s
            for child in self.children[c]:
                self.waiting[child] -= 1
                if self.waiting[child] == 0:
                    heapq.heappush(self._releases, (self.now_s + self.workload.coflows[child].delay_s, child))
        self._release_due()
        return self.now_s - start

    def bottleneck_s(self, cid: int) -> float:
        """Time the coflow's remaining bytes need at its busiest port with the whole fabric to itself."""
        up = np.zeros(self.workload.num_ports)
        down = np.zeros(self.workload.num_ports)
        for f, b in zip(self.workload.coflows[cid].flows, self.remaining[cid]):
            up[f.src] += b
            down[f.dst] += b
        return float(max(up.max(), down.max()) / self.workload.port_bandwidth_Bps)

    def job_bottleneck_s(self, job: int) -> float:
        """The same over all of a job's unfinished coflows, those not yet released included."""
        up = np.zeros(self.workload.num_ports)
        down = np.zeros(self.workload.num_ports)
        for cid in self.workload.jobs[job].coflows:
            if np.isnan(self.finished_s[cid]):
                for f, b in zip(self.workload.coflows[cid].flows, self.remaining[cid]):
                    up[f.src] += b
                    down[f.dst] += b
        return float(max(up.max(), down.max()) / self.workload.port_bandwidth_Bps)


@dataclass(frozen=True)
class Result:
    """Per-coflow completion times (finish minus release) and per-job completion times (last
    coflow's finish minus the job's arrival), with the jobs' weights."""

    cct_s: np.ndarray
    jct_s: np.ndarray
    weights: np.ndarray

    @property
    def avg_cct_s(self) -> float:
        return float(self.cct_s.mean())

    @property
    def avg_weighted_jct_s(self) -> float:
        return float((self.weights * self.jct_s).mean())

    @classmethod
    def of(cls, sim: FabricSim) -> "Result":
        if not sim.done:
            raise CaramelError("the simulation has not finished")
        w = sim.workload
        jct = np.array([sim.finished_s[list(j.coflows)].max() - j.arrival_s for j in w.jobs])
        return cls(sim.finished_s - sim.released_s, jct, np.array([j.weight for j in w.jobs]))


Scheduler = Callable[[FabricSim], list[int]]


def simulate(workload: Workload, scheduler: Scheduler) -> Result:
    """Run the workload to the end, asking `scheduler` for the priority order at every event."""
    sim = FabricSim(workload)
    while not sim.done:
        sim.advance(scheduler(sim) if sim.active else [])
    return Result.of(sim)
