"""Online decoding of the coflow policy: every decision made on the jobs that have arrived.

At every event with two or more released coflows, the decision is taken on a view of the state
restricted to the jobs that have arrived by then (`FabricSim.restricted`): their coflows, the
bytes they have left, the steps they still have to release. The policy observes that view (its
feature scales come from the arrived jobs too, not from the whole trace) and proposes a coflow.
`arrived:greedy` serves it. `arrived:check` rolls the proposal out against each heuristic's
first pick on the same view (each goes first for one event, then the base heuristic runs the
arrived work to its end) and serves the cheapest by the objective over the arrived jobs, the
proposal unless another is cheaper by more than `MARGIN`. `arrived:base` does the same against
the base heuristic's pick alone, so it rolls out only where the policy leaves the base (a
fraction of the events, so near greedy's cost). Nothing of a job that has not
arrived is read, so the decisions up to a time are the same whatever arrives later (tested),
unlike `check:M`, whose rollouts run the whole trace. The price: a rollout cannot see the
arrivals that will compete with what it plans, so it is no worse than the proposal only on
the arrived set, and no worse than the base heuristic only where every job has arrived.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from caramel.sched.coflow.env import CoflowEnv
from caramel.sched.coflow.fabric import FabricSim, Result
from caramel.sched.coflow.heuristics import HEURISTICS
from caramel.sched.coflow.rollout import MARGIN, rollout_values
from caramel.sched.coflow.workload import Workload

ARRIVED_MODES = ("greedy", "base", "check")


@dataclass(frozen=True)
class ArrivedDecision:
    """One decision: when, the policy's proposal and the coflow served (full trace ids), and with
    `arrived:check` each rolled-out candidate's objective total over the arrived jobs."""

    time_s: float
    arrived_jobs: int
    proposed: int
    served: int
    values: dict[int, float]


def decode_arrived(env: CoflowEnv, workload: Workload, logits: Callable[[np.ndarray], np.ndarray],
                   mode: str = "check", reuse: bool = True) -> tuple[Result, list[ArrivedDecision]]:
    """Run `workload` to its end, each decision taken on the arrived jobs (`mode` "greedy": the
    policy's proposal; "check": the proposal or a heuristic's pick, by rollouts on the arrived
    set; "base": the proposal or the base's pick, likewise); the result and the decisions.

    With `reuse`, the base's pick is not rolled out again where no job has arrived since the
    last rollout: its value is then the served candidate's from then (the same state run on under
    the base, so the same number; `reuse=False` recomputes it, tested equal)."""
    if mode not in ARRIVED_MODES:
        raise ValueError(f"mode must be one of {', '.join(ARRIVED_MODES)}, got {mode!r}")
    base, objective = env.base_scheduler, env.options.objective
    sim = FabricSim(workload)
    decisions: list[ArrivedDecision] = []
    carried: tuple[int, float] | None = None  # (jobs arrived, the base's value from here on) if known
    while not sim.done:
        if len(sim.active) < 2:  # nothing to choose (as the environment runs such events through)
            sim.advance(list(sim.active))
            continue
        view, ids = sim.restricted(sim.arrived_jobs())
        z = logits(env.observe(view))
        cands = env.candidates()
        a = int(np.argmax(z))
        proposed = cands[a if a < len(cands) else 0]  # a masked row is the base's pick, as in `env.step`
        served, values = proposed, {}
        if mode != "greedy":
            picks = (h(view)[0] for h in HEURISTICS.values()) if mode == "check" else [cands[0]]
            options = [proposed] + [c for c in dict.fromkeys(picks) if c != proposed]
            if len(options) > 1:
                known = {cands[0]: carried[1]} if reuse and carried and carried[0] == len(view.workload.jobs) else {}
                todo = [c for c in options if c not in known]
                known.update(zip(todo, rollout_values(view, base, todo, objective)))
                totals = np.array([known[c] for c in options])
                values = {ids[c]: float(v) for c, v in zip(options, totals)}
                best = int(np.argmin(totals))
                if totals[best] < totals[0] - MARGIN * abs(totals[0]):
                    served = options[best]
        decisions.append(ArrivedDecision(sim.now_s, len(view.workload.jobs), ids[proposed], ids[served], values))
        if values:
            carried = (len(view.workload.jobs), values[ids[served]])
        elif served != cands[0] or not carried or carried[0] != len(view.workload.jobs):
            carried = None  # (serving the base's pick keeps the base's value from here on)
        sim.advance([ids[served]] + [ids[c] for c in base(view) if c != served])
    return Result.of(sim), decisions
