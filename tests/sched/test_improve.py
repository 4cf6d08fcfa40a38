"""Policy improvement by rollouts: the rollouts never lose to their base, the ILP completes a
fixed prefix exactly, and the imitation fit makes the policy pick what its teacher picks."""
import numpy as np
import pytest

from caramel.errors import CaramelError
from caramel.sched.coflow import HEURISTICS as COFLOW_HEURISTICS
from caramel.sched.coflow import TraceOptions, simulate, synthetic_trace
from caramel.sched.coflow.fabric import FabricSim
from caramel.sched.coflow.rollout import objective_total, rollout_scheduler, rollout_values
from caramel.sched.placement import HEURISTICS, InstanceOptions, PlacementState, random_instance, solve_ilp
from caramel.sched.placement.rollout import rollout_placement

TRACE = TraceOptions(num_jobs=5, max_steps=2, max_layers=6)


def test_clone_is_independent_and_row_zero_is_the_base():
    w = synthetic_trace(TRACE, 4)
    base = COFLOW_HEURISTICS["weighted_srjf"]
    sim = FabricSim(w)
    twin = sim.clone()
    while not twin.done:
        twin.advance(base(twin) if twin.active else [])
    assert not sim.done and np.isnan(sim.finished_s).all()  # running the clone left the original alone
    values = rollout_values(sim, base, base(sim)[:4], "weighted_jct")
    assert values[0] == pytest.approx(objective_total(simulate(w, base), "weighted_jct"), rel=1e-12)


@pytest.mark.parametrize("objective", ["cct", "weighted_jct"])
def test_coflow_rollout_never_loses_to_its_base(objective):
    base = COFLOW_HEURISTICS["weighted_srjf"]
    gains = []
    for seed in range(4):
        w = synthetic_trace(TRACE, seed)
        b = objective_total(simulate(w, base), objective)
        r = objective_total(simulate(w, rollout_scheduler(base, objective, 4)), objective)
        assert r <= b * (1 + 1e-9), seed
        gains.append(b - r)
    assert max(gains) > 0  # and it does improve somewhere


def test_ilp_completes_a_fixed_prefix_and_checks_it():
    inst = random_instance(InstanceOptions(), 7)
    free = solve_ilp(inst)
    prefix = [[inst.cloud], [], [inst.cloud, inst.cloud]]
    fixed = solve_ilp(inst, fixed=prefix)
    assert fixed.optimal and inst.feasible(fixed.placement)
    assert all(p[:len(f)] == f for p, f in zip(fixed.placement, prefix))
    assert fixed.cost_s >= free.cost_s - 1e-9
    assert solve_ilp(inst, fixed=free.placement).cost_s == pytest.approx(free.cost_s, rel=1e-9)
    with pytest.raises(CaramelError, match="fixed must hold, per task"):
        solve_ilp(inst, fixed=[[9]])


def test_placement_rollout_never_loses_to_greedy_regret_and_state_clones():
    state = PlacementState(random_instance(InstanceOptions(), 0))
    twin = state.clone()
    twin.place(0, twin.inst.cloud)
    assert state.placed == 0 and state.placement == [[], [], []]
    better = 0
    for seed in range(6):
        inst = random_instance(InstanceOptions(), seed)
        r, g = rollout_placement(inst), HEURISTICS["greedy_regret"](inst)
        assert inst.feasible(r) and inst.cost_s(r) <= inst.cost_s(g) * (1 + 1e-12)
        better += inst.cost_s(r) < inst.cost_s(g) * (1 - 1e-9)
    assert better > 0


def test_bad_improve_options_name_the_option():
    from caramel.sched.improve import ImproveOptions

    for field, value in (("rounds", 0), ("episodes", 0), ("epochs", 0), ("batch_size", 1),
                         ("learning_rate", 0.0), ("cross_entropy", -1.0)):
        with pytest.raises(CaramelError, match=f"improve option {field} must be"):
            ImproveOptions(**{field: value})
