"""The ps model's link queues and all-to-all rate: small messages behind bulk transfers."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps.queues import Backlog, Queues, broadcast_rounds
from caramel.topology.spec import ClusterSpec


def test_a_message_waits_for_the_rest_of_the_run_it_lands_in_at_most_the_cap():
    q = Backlog(cap_s=3.0)
    q.add(1.0, 2.0)
    q.add(2.0, 4.0)  # back to back: one run, 1 to 4
    q.add(10.0, 20.0)
    assert (q.starts, q.ends) == ([1.0, 10.0], [4.0, 20.0])
    assert q.wait(0.5) == 0.0 and q.wait(5.0) == 0.0  # the queue is empty then
    assert q.wait(2.5) == pytest.approx(1.5)
    assert q.wait(11.0) == 3.0  # 9 s of transfer left, but a flow keeps only the cap queued
    q.forget_before(5.0)
    assert (q.starts, q.ends) == ([10.0], [20.0])
    with pytest.raises(ValueError):
        Backlog(cap_s=-1.0)


def test_a_message_waits_behind_its_senders_egress_and_its_receivers_ingress():
    qs = Queues(3, cap_s=10.0)
    qs.egress[0].add(0.0, 4.0)  # worker 0's pulls
    qs.ingress[2].add(0.0, 6.0)  # pushes into worker 2
    assert qs.wait(0, 1, 1.0) == pytest.approx(3.0)
    assert qs.wait(1, 2, 1.0) == pytest.approx(5.0)
    assert qs.wait(0, 2, 1.0) == pytest.approx(8.0)
    assert qs.wait(1, 0, 1.0) == 0.0  # nothing on that way


def test_each_buffer_broadcast_round_crosses_the_queues_twice():
    qs = Queues(2, cap_s=8.0)
    qs.egress[1].add(0.0, 34.0)  # both ranks' pulls fill their egress
    qs.egress[0].add(0.0, 34.0)
    done, got = broadcast_rounds(qs, root=0, post_s=[0.0, 0.0], rounds=2, message_s=0.5)
    # round 1: rank 1's note waits 8, the data 8 more; round 2 the same from 16.5
    assert got[1] == pytest.approx(8 + 8 + 0.5 + 8 + 8 + 0.5)
    assert done == pytest.approx(8 + 8 + 0.5 + 8)
    assert broadcast_rounds(Queues(2), 0, [1.0, 2.0], 1, 0.5) == (2.0, [2.0, 2.5])  # idle links: latency and bytes


@pytest.fixture(scope="module")
def profile():
    p = synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                          backward_time_s=0.04, optimizer_time_s=0.002)
    return dataclasses.replace(p, meta={**p.meta, "buffer_bytes": 8192, "buffer_broadcasts": 2})


def step_s(spec: str, profile, bandwidth_bps: float = 1e9, **meta) -> float:
    cluster = ClusterSpec.uniform(2, bandwidth_bps, latency_s=3e-4, meta=meta)
    return STRATEGIES.spec(spec).simulate(profile, cluster).step_time_s


def test_queues_slow_the_bsp_step_more_the_longer_a_flow_keeps_its_queue(profile):
    bare = step_s("ps", profile)
    short, long = step_s("ps", profile, link_queue_s=0.002), step_s("ps", profile, link_queue_s=0.008)
    assert bare < short < long
    # rank 0's buffers go at step(), ahead of the pulls: 2 rounds behind no queue (at the
    # forward's start, as before, they waited behind the pulls: up to a queue per round)
    without = step_s("ps", dataclasses.replace(profile, meta={}), link_queue_s=0.008)
    assert 0 <= long - without <= 2 * (3e-4 + 4096 / 125e6) + 1e-9
    # ssp sends no buffers at each forward
    no_broadcast = dataclasses.replace(profile, meta={})
    assert step_s("ps:consistency=ssp:1", profile, link_queue_s=0.008) == \
        step_s("ps:consistency=ssp:1", no_broadcast, link_queue_s=0.008)


def test_the_links_efficiency_for_each_pattern_slows_the_flat_servers_transfers(profile):
    full = step_s("ps", profile, 3e8)
    pushes, pulls = step_s("ps", profile, 3e8, push_efficiency=0.5), step_s("ps", profile, 3e8, pull_efficiency=0.5)
    both = step_s("ps", profile, 3e8, push_efficiency=0.5, pull_efficiency=0.5)
    assert full < pushes < both and full < pulls < both
    assert both > full * 1.5  # communication-bound at 300 Mbit/s: every transfer takes twice as long
    assert step_s("ps", profile, 3e8, push_efficiency=1.0, pull_efficiency=1.0) == full


@pytest.mark.parametrize("meta, what", [({"link_queue_s": -1}, "link_queue_s"), ({"link_queue_s": "x"}, "link_queue_s"),
                                        ({"push_efficiency": 0}, "push_efficiency"),
                                        ({"pull_efficiency": 1.5}, "pull_efficiency")])
def test_bad_traffic_inputs_are_named(profile, meta, what):
    with pytest.raises(CaramelError, match=what):
        step_s("ps", profile, **meta)


def test_the_used_count_all_reduce_costs_a_rings_latencies_after_the_last_push(profile):
    """On an unbounded link only latencies remain: the pull's and the used-count ring's 2(n-1)."""
    def exposed_ms(n: int, latency_s: float) -> float:
        cluster = ClusterSpec.uniform(n, 1e15, latency_s=latency_s)
        return (STRATEGIES.spec("ps").simulate(profile, cluster).step_time_s - profile.step_time_s) * 1e3

    for n in (2, 4):
        extra = exposed_ms(n, 1e-3) - exposed_ms(n, 0.0)
        # the last push (1 latency), the used count (2(n-1)), the first module's pull (1), at most the
        # optimizer's share of a faster step
        assert 2 * (n - 1) + 2 - 0.5 < extra < 2 * (n - 1) + 2 + 0.5, (n, extra)
