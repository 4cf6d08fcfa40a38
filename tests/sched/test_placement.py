"""Edge-cloud placement: the ILP against brute force, memory limits, the heuristics on a hand-made
instance, and the environment's reward (minus the cost) and action 0 (greedy_regret)."""
import numpy as np
import pytest

from caramel.errors import CaramelError
from caramel.sched.placement import (HEURISTICS, Instance, InstanceOptions, Task, brute_force, random_instance,
                                     solve_ilp)
from caramel.strategies.options import build_options

TINY = InstanceOptions(num_tasks=2, num_layers=3, num_edge=2)


def _one_layer(memory_mb: float) -> Instance:
    """One task of one 1-GFLOP, 10 MB layer at edge node 0 (10 GFLOP/s); the cloud 100 GFLOP/s
    over a 10 MB/s, 10 ms link; input 1 MB, result 1 MB."""
    bw = np.array([[np.inf, 10.0], [10.0, np.inf]])
    lat = np.array([[0.0, 0.01], [0.01, 0.0]])
    task = Task(source=0, gflop=(1.0,), weights_mb=(10.0,), out_mb=(1.0,), in_mb=1.0, current=(0,))
    return Instance((task,), (10.0, 100.0), (memory_mb,), bw, lat, migration_weight=1.0)


def test_costs_by_hand_and_memory_forces_the_cloud():
    inst = _one_layer(memory_mb=20.0)
    assert inst.cost_s([[0]]) == pytest.approx(0.1)  # 1 GFLOP at 10 GFLOP/s, no hop, no move
    # cloud: hop in 0.01 + 0.1, 0.01 s compute, migrate 0.01 + 1.0, hop back 0.01 + 0.1
    assert inst.cost_s([[1]]) == pytest.approx(1.24)
    assert solve_ilp(inst).placement == [[0]]
    squeezed = _one_layer(memory_mb=5.0)
    for solve in (solve_ilp, brute_force):
        assert solve(squeezed).placement == [[1]]
    for name, heuristic in HEURISTICS.items():
        assert heuristic(squeezed) == [[1]], name
        assert heuristic(inst) == ([[1]] if name == "all_cloud" else [[0]]), name


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ilp_is_optimal_against_brute_force(seed):
    inst = random_instance(TINY, seed)
    exact, ilp = brute_force(inst), solve_ilp(inst)
    assert ilp.optimal and inst.feasible(ilp.placement)
    assert ilp.cost_s == pytest.approx(exact.cost_s, rel=1e-9)
    for heuristic in HEURISTICS.values():
        p = heuristic(inst)
        assert inst.feasible(p) and inst.cost_s(p) >= exact.cost_s - 1e-9


def test_options_and_instance_errors():
    with pytest.raises(CaramelError, match="did you mean 'num_tasks'"):
        build_options(InstanceOptions, {"num_task": 3}, "instances")
    with pytest.raises(CaramelError, match="num_tasks, num_layers and num_edge must be >= 1"):
        build_options(InstanceOptions, {"num_edge": 0}, "instances")
    inst = _one_layer(1.0)
    with pytest.raises(CaramelError, match="source must be an edge node"):
        Instance((Task(1, (1.0,), (1.0,), (1.0,), 1.0, (0,)),), inst.node_gflops, inst.memory_mb,
                 inst.bandwidth_MBps, inst.latency_s)
    with pytest.raises(CaramelError, match="brute force would try"):
        brute_force(random_instance(InstanceOptions(num_tasks=4, num_layers=4), 0))


def test_env_return_is_minus_the_cost_and_action_zero_is_greedy_regret():
    from caramel.sched.placement.env import PlacementEnv, run_policy
    opts = InstanceOptions(num_tasks=4, num_layers=4, num_edge=3)
    env = PlacementEnv(opts, [0])
    inst = random_instance(opts, 5)
    env.reset(options={"instance": inst})
    total, done = 0.0, False
    while not done:
        _, reward, done, _, _ = env.step(0)
        total += reward
    assert env.placement() == HEURISTICS["greedy_regret"](inst)
    assert total * env.scale_s == pytest.approx(-inst.cost_s(env.placement()), rel=1e-9)
    # any action sequence gives a feasible placement (nodes without room are masked)
    rng = np.random.default_rng(0)
    for _ in range(5):
        p = run_policy(env, inst, lambda obs: int(rng.integers(len(obs))))
        assert inst.feasible(p)


@pytest.mark.parametrize("opts", [InstanceOptions(), InstanceOptions(num_tasks=6, num_layers=5, num_edge=5,
                                                                     memory_fraction=0.15)])
def test_tables_and_vectorized_observation_equal_the_reference_loops(opts):
    """Along episodes of random actions: the table lookups, the next task and the observation
    equal the per-(task, node) Python loops they replace, exactly."""
    from caramel.sched.placement.env import PlacementEnv
    env = PlacementEnv(opts, [0])
    for seed in range(3):
        inst = random_instance(opts, seed)
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(options={"instance": inst})
        s, steps = env.state, 0
        for t in range(len(inst.tasks)):
            want = [[[inst.step_s(t, lay, a, b) for b in range(inst.num_nodes)] for a in range(inst.num_nodes)]
                    for lay in range(opts.num_layers)]
            assert np.array_equal(s.tables.step[t], want) and np.array_equal(s.h[t], inst.cost_to_go(t))
        done = False
        while not done:
            assert np.array_equal(obs, env._observe_reference())
            assert env.task == s._most_regret_task_reference()
            for t in s.open_tasks():
                assert np.array_equal(s.scores(t), s._scores_reference(t))
                assert np.array_equal(s._wish_mb[t], s._wish_reference(t))
            obs, _, done, _, _ = env.step(int(rng.integers(inst.num_nodes)))
            steps += 1
        assert steps == s.total_layers and inst.feasible(env.placement())


def test_batched_rollouts_equal_single_environments():
    """N episodes stepped as arrays: the same observations, placements and costs as N
    `PlacementEnv`s given the same actions, exactly (some actions hit rows without room)."""
    from caramel.sched.placement.batch import BatchPlacement
    from caramel.sched.placement.env import PlacementEnv
    opts = InstanceOptions(num_tasks=5, num_layers=4, num_edge=4, memory_fraction=0.2)
    for seed in range(3):
        inst, n = random_instance(opts, seed), 6
        batch, envs = BatchPlacement(inst, n), [PlacementEnv(opts, [0]) for _ in range(n)]
        obs = np.stack([e.reset(options={"instance": inst})[0] for e in envs])
        rng = np.random.default_rng(seed)
        while not batch.done:
            assert np.array_equal(batch.observe(), obs)
            actions = rng.integers(inst.num_nodes, size=n)
            batch.step(actions)
            obs = np.stack([e.step(int(a))[0] for e, a in zip(envs, actions)])
        assert all(e.state.done for e in envs)
        assert batch.placements() == [e.placement() for e in envs]
        assert np.array_equal(batch.cost_s, [e.state.cost_s for e in envs])
    with pytest.raises(CaramelError, match="actions must be 6 rows in 0..4"):
        batch.step(np.full(n, 5))
