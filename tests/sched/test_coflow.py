"""Coflow scheduling: the fabric's rates and DAG releases, the heuristics' known orders, the
environment's reward (minus the summed completion times) and its action 0 (the base heuristic)."""
import numpy as np
import pytest

from caramel.errors import CaramelError
from caramel.plan.planners import plan_fifo
from caramel.sched.coflow import (HEURISTICS, Coflow, Flow, Job, TraceOptions, Workload, job_from_plan, simulate,
                                  synthetic_trace)
from caramel.sched.coflow.fabric import FabricSim
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.options import build_options

BW = 100.0  # bytes per second: times below are bytes / 100


def _workload(coflows, jobs, ports=4):
    return Workload(ports, BW, tuple(jobs), tuple(coflows))


def _two_on_one_port(weight_big=1.0):
    """A big (1000 B) and a small (100 B) coflow of two jobs, both 0 -> 1, both released at 0."""
    big = Coflow(0, 0, 0, 0, (Flow(0, 1, 1000.0),), (), 0.0)
    small = Coflow(1, 1, 0, 0, (Flow(0, 1, 100.0),), (), 0.0)
    return _workload([big, small], [Job(0, weight_big, 0.0, (0, 1), (0,)), Job(1, 1.0, 0.0, (0, 1), (1,))])


def test_fifo_and_sebf_on_one_port_known_answers():
    w = _two_on_one_port()
    fifo = simulate(w, HEURISTICS["fifo"])  # big first: 10 s, then small at 11 s
    np.testing.assert_allclose(fifo.cct_s, [10.0, 11.0])
    for name in ("sebf", "scf", "weighted_sebf"):  # small first: 1 s, big at 11 s
        np.testing.assert_allclose(simulate(w, HEURISTICS[name]).cct_s, [11.0, 1.0])
    # weight 20 on the big job: its bottleneck over weight (0.5 s) beats the small one's (1 s)
    heavy = simulate(_two_on_one_port(weight_big=20.0), HEURISTICS["weighted_sebf"])
    np.testing.assert_allclose(heavy.cct_s, [10.0, 11.0])
    assert heavy.avg_weighted_jct_s == pytest.approx((20 * 10 + 11) / 2)


def test_weighted_srjf_finishes_the_job_with_less_work_left_first():
    # job 0: 100 B then (next step) 1000 B; job 1: 200 B; all 0 -> 1, all released at 0
    cs = [Coflow(0, 0, 0, 0, (Flow(0, 1, 100.0),), (), 0.0), Coflow(1, 0, 1, 0, (Flow(0, 1, 1000.0),), (0,), 0.0),
          Coflow(2, 1, 0, 0, (Flow(0, 1, 200.0),), (), 0.0)]
    w = _workload(cs, [Job(0, 1.0, 0.0, (0, 1), (0, 1)), Job(1, 1.0, 0.0, (0, 1), (2,))])
    np.testing.assert_allclose(simulate(w, HEURISTICS["sebf"]).jct_s, [13.0, 3.0])  # job 0's 100 B first
    np.testing.assert_allclose(simulate(w, HEURISTICS["weighted_srjf"]).jct_s, [13.0, 2.0])  # job 1 first


def test_madd_paces_a_coflow_to_its_bottleneck_and_backfills():
    # A: 0->1 200 B and 2->3 100 B; B (lower priority): 2->3 100 B. MADD gives A's short flow
    # half of port 2, so B gets the other half: both finish at 2 s, not A at 2 s and B at 3 s.
    a = Coflow(0, 0, 0, 0, (Flow(0, 1, 200.0), Flow(2, 3, 100.0)), (), 0.0)
    b = Coflow(1, 1, 0, 0, (Flow(2, 3, 100.0),), (), 0.0)
    w = _workload([a, b], [Job(0, 1.0, 0.0, (0, 1, 2, 3), (0,)), Job(1, 1.0, 0.0, (2, 3), (1,))])
    np.testing.assert_allclose(simulate(w, HEURISTICS["fifo"]).cct_s, [2.0, 2.0])
    # alone, the short flow is backfilled to the full port: A still ends at 2 s (its long flow)
    alone = _workload([a], [Job(0, 1.0, 0.0, (0, 1, 2, 3), (0,))])
    np.testing.assert_allclose(simulate(alone, HEURISTICS["fifo"]).cct_s, [2.0])


def test_a_step_waits_for_the_previous_one_plus_its_delay():
    first = Coflow(0, 0, 0, 0, (Flow(0, 1, 100.0),), (), 0.5)
    second = Coflow(1, 0, 1, 0, (Flow(0, 1, 100.0),), (0,), 0.25)
    w = _workload([first, second], [Job(0, 1.0, 2.0, (0, 1), (0, 1))])
    sim = FabricSim(w)
    while not sim.done:
        sim.advance(list(sim.active))
    np.testing.assert_allclose(sim.released_s, [2.5, 3.75])  # arrival + 0.5; finish 3.5 + 0.25
    np.testing.assert_allclose(sim.finished_s, [3.5, 4.75])
    assert simulate(w, HEURISTICS["sebf"]).jct_s[0] == pytest.approx(2.75)


def test_a_plan_becomes_ring_allreduce_coflows_per_step():
    profile = synthetic_profile(sizes_bytes=[4096, 8192, 4096], forward_time_s=0.01, backward_time_s=0.02)
    plan = plan_fifo(profile, world_size=3, bucket_cap_mb=0.01, first_bucket_mb=0.005)
    job, coflows = job_from_plan(plan, profile, [4, 1, 2], steps=2, job_id=0, first_coflow_id=0)
    assert len(coflows) == 2 * len(plan.buckets)
    for c in coflows:
        bucket = plan.buckets[c.bucket]
        assert [(f.src, f.dst) for f in c.flows] == [(4, 1), (1, 2), (2, 4)]
        assert all(f.bytes == pytest.approx(2 * 2 / 3 * bucket.bytes) for f in c.flows)
        assert c.deps == (() if c.step == 0 else tuple(range(len(plan.buckets))))
        assert c.delay_s == pytest.approx(0.01 + bucket.ready_time_s)
    with pytest.raises(CaramelError, match="distinct ports"):
        job_from_plan(plan, profile, [1, 1], steps=1, job_id=0, first_coflow_id=0)


def test_trace_options_errors_name_the_input():
    with pytest.raises(CaramelError, match="did you mean 'num_jobs'"):
        build_options(TraceOptions, {"num_job": 3}, "trace")
    with pytest.raises(CaramelError, match="max_workers must be between 2 and num_ports"):
        build_options(TraceOptions, {"num_ports": 3, "max_workers": 4}, "trace")
    with pytest.raises(CaramelError, match="order .* must list every active coflow"):
        FabricSim(_two_on_one_port()).advance([0])


@pytest.mark.parametrize("objective", ["cct", "weighted_jct"])
def test_env_return_is_minus_the_objective_and_action_zero_is_the_base(objective):
    from caramel.sched.coflow.env import CoflowEnv, EnvOptions, run_policy
    trace = TraceOptions(num_jobs=6, max_steps=2)
    env = CoflowEnv(trace, [0], EnvOptions(objective=objective, base="sebf"))
    w = synthetic_trace(trace, 3)
    ref = simulate(w, HEURISTICS["sebf"])
    env.reset(options={"workload": w})
    total, done, steps = 0.0, False, 0
    while not done:
        _, reward, done, _, _ = env.step(0)
        total += reward
        steps += 1
    res = env.result()
    np.testing.assert_allclose(res.cct_s, ref.cct_s)
    expected = ref.cct_s.sum() if objective == "cct" else (ref.weights * ref.jct_s).sum()
    assert total * env.scale_s == pytest.approx(-expected, rel=1e-9)
    assert steps > 5
    # a different choice changes the schedule (the action matters), and every coflow still ends
    other = run_policy(env, w, lambda obs: int((obs[:, 0] > 0).sum()) - 1)
    assert np.isfinite(other.cct_s).all() and not np.allclose(other.cct_s, ref.cct_s)


def test_a_trace_that_needs_no_choice_ends_at_the_first_step_with_its_whole_cost():
    """Seed 1118 of 3 one-step jobs never has two coflows released at once: the episode is over
    at reset. A step taken anyway (SB3's PPO steps after every reset) ends it, whatever the
    action, and its reward is still minus the objective."""
    from caramel.sched.coflow.env import CoflowEnv, EnvOptions
    trace = TraceOptions(num_jobs=3, max_steps=1)
    ref = simulate(synthetic_trace(trace, 1118), HEURISTICS["weighted_sebf"])
    env = CoflowEnv(trace, [1118], EnvOptions(objective="cct"))
    obs, _ = env.reset(seed=0)
    assert env.episode_done and not obs[:, 0].any()  # no candidate to pick
    obs, reward, done, truncated, _ = env.step(3)
    assert done and not truncated and not obs.any()
    assert reward * env.scale_s == pytest.approx(-ref.cct_s.sum(), rel=1e-9)
    np.testing.assert_allclose(env.result().cct_s, ref.cct_s)
