"""The ps strategy's simulator model: order, consistency, slow workers, one worker."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.topology.spec import ClusterSpec


def sim(spec: str, profile, cluster):
    return STRATEGIES.spec(spec).simulate(profile, cluster)


@pytest.fixture(scope="module")
def profile():
    # a chain of 12 layers, the first ones big (as a CNN's are not; a comm-bound MLP's are)
    return synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                             backward_time_s=0.04, optimizer_time_s=0.002)


def test_one_worker_is_compute_only(profile):
    r = sim("ps", profile, ClusterSpec.uniform(1, 1e9))
    assert r.step_time_s == pytest.approx(profile.step_time_s)
    assert r.comm_time_s == 0.0


def test_tac_beats_random_and_fifo_when_communication_bound(profile):
    cluster = ClusterSpec.uniform(4, 1e9)
    # per tensor (no fusion): 12 transfers per server to order; fused, each server has one bucket
    tac, rnd, fifo = (sim(f"ps:bucket_cap_mb=0,order={o}", profile, cluster) for o in ("tac", "random", "fifo"))
    assert tac.step_time_s < rnd.step_time_s and tac.step_time_s < fifo.step_time_s
    assert tac.meta["tictac"]["tac"]["E"] >= tac.meta["tictac"]["fifo"]["E"]
    assert tac.step_time_s >= tac.compute_time_s
    assert len(tac.trace.events) > 0


def test_staleness_hides_a_slow_worker_and_communication(profile):
    cluster = ClusterSpec.uniform(4, 1e9)
    cluster.workers[3].speed = 1 / 1.5
    bsp, ssp = sim("ps", profile, cluster), sim("ps:consistency=ssp_2", profile, cluster)
    assert ssp.step_time_s < bsp.step_time_s
    even = sim("ps", profile, ClusterSpec.uniform(4, 1e9))
    assert bsp.step_time_s > even.step_time_s  # the slowed worker holds everyone back under bsp
    assert ssp.step_time_s >= 1.5 * profile.compute_time_s * 0.99  # never faster than the slow worker's compute


def test_more_servers_than_workers_is_an_error(profile):
    with pytest.raises(CaramelError, match="servers=8 but the job has only 4 ranks"):
        sim("ps:servers=8", profile, ClusterSpec.uniform(4, 1e9))


def test_hierarchy_sends_one_gradient_per_node(profile):
    flat = ClusterSpec.uniform(8, 1e9)
    nodes = ClusterSpec.uniform(8, 1e9)
    nodes.meta.update(workers_per_node=4, node_bandwidth_bps=100e9)
    hier = sim("ps:hierarchical=true", profile, nodes)
    assert hier.meta["workers_per_node"] == 4
    assert hier.step_time_s < sim("ps", profile, flat).step_time_s
    assert hier.comm_time_s < sim("ps", profile, flat).comm_time_s
    with pytest.raises(CaramelError, match="workers_per_node"):
        sim("ps:hierarchical=true", profile, flat)


def test_dedicated_servers_receive_every_workers_copy_and_join_at_step(profile):
    """Comm-bound: a dedicated server's NIC takes one copy per worker (colocated: per other
    worker), so one dedicated server is slower than two colocated ones and two dedicated servers
    halve its load; pushes wait for every worker's step(), so no push hides behind backward."""
    slow = ClusterSpec.uniform(2, 50e6)
    colocated = sim("ps", profile, slow)
    one = sim("ps:servers=1,dedicated=true", profile, slow)
    two = sim("ps:servers=2,dedicated=true", profile, slow)
    assert one.meta["dedicated_servers"] == 1 and two.meta["dedicated_servers"] == 2
    assert one.step_time_s > two.step_time_s > colocated.step_time_s
    total_bytes = sum(p.bytes for p in profile.trainable())
    wire_s = 2 * 2 * total_bytes * 8 / 50e6  # push and pull, two copies each through one server's NIC
    # pulls may overlap the next forward, but no push overlaps backward
    assert one.step_time_s >= wire_s + profile.backward_time_s
    # the workers run no optimizer: with compute only (a fast link) the step is forward + backward
    # and the server's apply of its shard (half the optimizer), which the next forward waits for
    fast = sim("ps:servers=2,dedicated=true", profile, ClusterSpec.uniform(2, 1e15, latency_s=0.0))
    assert fast.step_time_s == pytest.approx(profile.forward_time_s + profile.backward_time_s
                                             + profile.optimizer_time_s / 2, rel=0.05)
    with pytest.raises(CaramelError, match="servers=N >= 1"):
        sim("ps:dedicated=true", profile, slow)


def test_compute_beside_the_pushes_and_pulls_runs_at_the_clusters_slowdown():
    profile = synthetic_profile(sizes_bytes=[1 << 20] * 8)  # 30 ms forward, 60 ms backward

    def step_ms(spec: str, f: float) -> float:
        return STRATEGIES.spec(spec).simulate(profile, ClusterSpec.uniform(2, 1e9, compute_slowdown=f)).step_time_s * 1e3

    for spec in ("ps", "ps:consistency=ssp:2", "ps:bucket_cap_mb=0"):
        calm, slowed = step_ms(spec, 1.0), step_ms(spec, 1.5)
        # pulls overlap the forward and pushes the backward: at most 1.5x the compute is added
        assert calm + 5.0 < slowed < calm + 0.5 * 90.0, (spec, calm, slowed)


def test_the_wire_keeps_its_transfers_as_disjoint_ordered_intervals():
    from caramel.strategies.ps.simulate import Wire

    wire = Wire(2.0)
    wire.add([(5.0, 6.0), (1.0, 2.0), (1.5, 3.0), (8.0, 9.0), (2.9, 5.5), (10.0, 10.0)])
    assert (wire.starts, wire.ends) == ([1.0, 8.0], [6.0, 9.0])
    busy = wire.busy(7.0, extra=[(9.5, 11.0)])  # only what ends after 7 s, plus this step's pushes
    assert (busy.starts, busy.ends) == ([8.0, 9.5], [9.0, 11.0]) and wire.starts == [1.0, 8.0]
    assert busy.advance(7.5, 1.0) == 8.0 + 2 * 0.5  # 0.5 s of work before the transfer, the rest at half speed
    wire.forget_before(7.0)
    assert (wire.starts, wire.ends) == ([8.0], [9.0])
    assert Wire(1.0).busy(0.0).advance(0.0, 1.0) == 1.0  # no contention: nothing recorded
