"""The ps simulator's hierarchical pushes: each leader's node sum leaves as soon as its node's
reduce has landed, point to point to the server leader (`sim_hier.py`), not a collective among
the leaders that starts once every node has its sum."""
from __future__ import annotations

import pytest

from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps.sim_hier import LeaderSends
from caramel.topology.spec import ClusterSpec

MB = 1e6


def sends(nodes: int = 3, local: int = 2, latency_s: float = 0.0) -> LeaderSends:
    # between nodes 1 MB/s, within a node 10 MB/s: one copy is 1 s on a NIC, 0.1 s in a node
    return LeaderSends(nodes, local, serving=nodes, latency_s=latency_s, rate_Bps=1 * MB, node_rate_Bps=10 * MB)


def test_a_node_sum_leaves_when_its_node_has_it_not_when_every_node_has():
    """3 nodes of 2; node 2's ranks hand the bucket over 5 s late. Server 0 receives node 1's
    sum from 0.1 s (its reduce landed) and node 2's from 5.1 s: its NIC is done at 6.1 s, one
    copy after the late one. A collective among the leaders would start at 5.1 s and carry
    two copies: 7.1 s."""
    hs = sends()
    start, end = hs.push(1 * MB, owner=0, handed=[0.0, 0.0, 0.0, 0.0, 5.0, 5.0], pulls_end=[0.0] * 3)
    assert start == 0.0
    assert hs.node_end == pytest.approx([0.1, 0.1, 5.1])
    assert end == pytest.approx(6.1)
    assert hs.send_free == [0.0, pytest.approx(6.1), pytest.approx(6.1)]  # each sender waits for its send


def test_the_servers_nic_takes_every_other_leaders_copy():
    """All ready together: the server's NIC receives (nodes - 1) copies, one latency."""
    hs = sends(nodes=4, latency_s=0.01)
    _, end = hs.push(1 * MB, owner=2, handed=[0.0] * 8, pulls_end=[0.0] * 4)
    assert end == pytest.approx(0.01 + 0.1 + 0.01 + 3 * 1.0)


def test_the_node_reduces_run_ahead_of_the_leaders_sends():
    """Two buckets to one server: the second bucket's node reduces start when the first's have
    landed (their own groups), not when its sends are done; its copies queue behind the first's
    on the server's NIC."""
    hs = sends(nodes=2)
    _, first = hs.push(1 * MB, owner=0, handed=[0.0] * 4, pulls_end=[0.0, 0.0])
    start, second = hs.push(1 * MB, owner=0, handed=[0.0] * 4, pulls_end=[0.0, 0.0])
    assert first == pytest.approx(1.1)
    assert start == pytest.approx(0.1) and start < first
    assert second == pytest.approx(2.1)


def test_a_serving_leaders_node_sum_waits_for_the_pulls_it_handed_over_before():
    """A serving leader sends on its own pull group: its node sum follows its earlier pulls."""
    hs = sends(nodes=2)
    _, end = hs.push(1 * MB, owner=0, handed=[0.0] * 4, pulls_end=[0.0, 3.0])
    assert end == pytest.approx(4.0)


def test_the_simulator_runs_a_servers_next_node_reduce_beside_its_last_sends():
    """Bsp, 3 nodes of 2 at 100 Mbit/s between nodes and 200 Mbit/s within them, buckets of
    0.5 MB: in the steady step, a server's next bucket starts (its node reduces) before its
    previous bucket's sums have all landed; in the collective model it waited for both stages."""
    profile = synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                                backward_time_s=0.04, optimizer_time_s=0.002)
    cluster = ClusterSpec.uniform(6, 1e8)
    cluster.meta.update(workers_per_node=2, node_bandwidth_bps=2e8)
    r = STRATEGIES.spec("ps:hierarchical=true,bucket_cap_mb=0.5").simulate(profile, cluster)
    last: dict[int, float] = {}
    overlapped = 0
    for _, owner, start, end in r.meta["timeline_s"]["pushes"]:
        if owner in last:
            overlapped += start < last[owner]
            assert end > last[owner]  # the server's NIC takes one bucket's copies after another
        last[owner] = end
    assert overlapped >= 2
