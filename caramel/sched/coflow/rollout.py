"""Rollout of a base heuristic: at each event, try each of the first candidates first, run the
base to the end, keep the best (Bertsekas's rollout: never worse than the base's own choice,
since that choice is among those tried). Too slow to deploy (a whole simulation per candidate
per event); it labels the learned policy's training states (`caramel.sched.improve`) and is
reported as a separate lookahead baseline, with its solve time.
"""
from __future__ import annotations

import numpy as np

from caramel.sched.coflow.fabric import FabricSim, Result, Scheduler

# a candidate must beat the base's choice by this much (relative) to be preferred: float noise,
# and near-ties the network could not tell apart anyway, stay with the base
MARGIN = 1e-6


def objective_total(result: Result, objective: str) -> float:
    """Summed coflow completion times (`cct`) or summed weighted job completion times."""
    return float(result.cct_s.sum()) if objective == "cct" else float((result.weights * result.jct_s).sum())


def finish(sim: FabricSim, base: Scheduler) -> Result:
    """Run `sim` (in place) to the end under `base`."""
    while not sim.done:
        sim.advance(base(sim) if sim.active else [])
    return Result.of(sim)


def rollout_values(sim: FabricSim, base: Scheduler, candidates: list[int], objective: str) -> np.ndarray:
    """Per candidate: the objective's total when it goes first for one event, then `base` to the end."""
    order = base(sim)
    values = []
    for c in candidates:
        trial = sim.clone()
        trial.advance([c] + [x for x in order if x != c])
        values.append(objective_total(finish(trial, base), objective))
    return np.array(values)


def best_index(values: np.ndarray) -> int:
    """The first candidate within MARGIN of the best value; 0 (the base) unless another is clearly better."""
    best = float(values.min())
    if values[0] <= best + MARGIN * abs(values[0]):
        return 0
    return int(np.argmax(values <= best + MARGIN * abs(best)))


def rollout_scheduler(base: Scheduler, objective: str, max_candidates: int = 8) -> Scheduler:
    """A scheduler (for `simulate`) that rolls `base` out over its first `max_candidates` at every event."""
    def order(sim: FabricSim) -> list[int]:
        ranked = base(sim)
        if len(ranked) < 2:
            return ranked
        first = ranked[best_index(rollout_values(sim, base, ranked[:max_candidates], objective))]
        return [first] + [c for c in ranked if c != first]
    return order


def rollout_teacher(env) -> np.ndarray:
    """The `caramel.sched.improve` teacher for a `CoflowEnv`: per row, the rollout's total."""
    return rollout_values(env.sim, env.base_scheduler, env.candidates(), env.options.objective)
