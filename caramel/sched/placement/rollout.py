"""Teachers for the learned placement policy, and a rollout baseline.

Rollout of greedy_regret: for the layer greedy_regret places next, try every node it fits on,
finish the placement with greedy_regret, keep the cheapest (never worse than greedy_regret,
whose own choice is among those tried). The ILP teacher asks HiGHS for the best completion of
the partial placement (exact; fast on small instances only). Both label the states of
`caramel.sched.improve`; the rollout is also reported as a separate lookahead baseline with its
solve time, never as the learned policy.
"""
from __future__ import annotations

import numpy as np

from caramel.sched.placement.heuristics import PlacementState
from caramel.sched.placement.ilp import solve_ilp
from caramel.sched.placement.problem import Instance

# another node must beat the first-ranked one by this much (relative) to be preferred
MARGIN = 1e-9


def finish_greedy_regret(state: PlacementState) -> float:
    """Complete `state` (in place) as greedy_regret would; the placement's cost."""
    while not state.done:
        t = state.most_regret_task()
        state.place(t, int(np.argmin(state.scores(t))))
    return state.cost_s


def rollout_values(state: PlacementState, t: int, nodes: list[int]) -> np.ndarray:
    """Per node (inf where the layer does not fit): the cost of placing task t's next layer there,
    then greedy_regret to the end."""
    values = []
    for k in nodes:
        if not state.fits(t, k):
            values.append(np.inf)
            continue
        trial = state.clone()
        trial.place(t, k)
        values.append(finish_greedy_regret(trial))
    return np.array(values)


def _first_best(values: np.ndarray) -> int:
    best = float(values.min())
    return int(np.argmax(values <= best + MARGIN * abs(best)))


def rollout_placement(inst: Instance) -> list[list[int]]:
    """The rollout baseline: greedy_regret's order, each layer on its best node by rollout."""
    state = PlacementState(inst)
    while not state.done:
        t = state.most_regret_task()
        nodes = [int(k) for k in np.argsort(state.scores(t), kind="stable")]
        state.place(t, nodes[_first_best(rollout_values(state, t, nodes))])
    return state.placement


def rollout_teacher(env) -> np.ndarray:
    """`caramel.sched.improve` teacher for a `PlacementEnv`: per row, the rollout's cost."""
    return rollout_values(env.state, env.task, env.order)


def ilp_teacher(env) -> np.ndarray:
    """`caramel.sched.improve` teacher for a `PlacementEnv`: per row, the cost of the exact best
    completion of the partial placement with the layer on that row's node (inf: no room)."""
    state, t = env.state, env.task
    values = []
    for k in env.order:
        if not state.fits(t, k):
            values.append(np.inf)
            continue
        fixed = [list(p) for p in state.placement]
        fixed[t].append(k)
        values.append(solve_ilp(state.inst, fixed=fixed).cost_s)
    return np.array(values)
