"""The ps simulator's hierarchical pushes on gloo: each leader's node sum leaves as soon as its
node's reduce has landed, point to point to the server leader (`sim_hier.py`), not a collective
among the leaders that starts once every node has its sum (off gloo the runtime keeps that
collective, and so does the simulator)."""
from __future__ import annotations

import pytest

from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.errors import CaramelError
from caramel.strategies.ps.sim_hier import LeaderSends, shared_finish
from caramel.topology.spec import ClusterSpec, WorkerSpec

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
    # each sender is free once its NIC has put its own copy out, not when the server has every copy
    assert hs.send_free == [0.0, pytest.approx(1.1), pytest.approx(6.1)]


def test_copies_in_flight_share_the_servers_nic():
    """Copy 1 alone from 0.1 s (0.5 s of its 1 s done by 0.6 s), then both at half rate: copy
    1's last 0.5 s takes 1 s (in at 1.6 s); copy 2 has 0.5 s done by then, alone after: 2.1 s."""
    assert shared_finish({1: 0.1, 2: 0.6}, 1.0) == {1: pytest.approx(1.6), 2: pytest.approx(2.1)}


def test_a_bucket_enters_the_servers_nic_after_its_previous_buckets_copies():
    """3 nodes, two buckets to server 0. Bucket 1: both copies enter at 0.1 s and share the NIC,
    in at 2.1 s; each sender is free at 1.1 s. Bucket 2's node sums land at 0.2 s and the
    senders are free at 1.1 s, but the server's NIC has bucket 1's copies until 2.1 s: in at
    4.1 s (without that rule 3.1 s), the senders free again at 3.1 s."""
    hs = sends()
    _, first = hs.push(1 * MB, owner=0, handed=[0.0] * 6, pulls_end=[0.0] * 3)
    assert first == pytest.approx(2.1) and hs.send_free == [0.0, pytest.approx(1.1), pytest.approx(1.1)]
    _, second = hs.push(1 * MB, owner=0, handed=[0.0] * 6, pulls_end=[0.0] * 3)
    assert second == pytest.approx(4.1) and hs.send_free == [0.0, pytest.approx(3.1), pytest.approx(3.1)]


def test_no_node_sum_moves_before_the_server_leader_posts_its_receives():
    """The server leader posts the step's receives at its first hand-over (`NodeSums.expect`),
    here 3 s: the node sums, landed at 0.1 s, move from 3 s, two copies: 5 s."""
    _, end = sends().push(1 * MB, owner=0, handed=[0.0] * 6, pulls_end=[0.0] * 3, posted_s=3.0)
    assert end == pytest.approx(5.0)


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


def late_node(backend: str | None, probe: bool = False) -> ClusterSpec:
    """3 nodes of 2 at 1 MB/s between nodes, 10 MB/s within, no latency; node 2 half speed."""
    cluster = ClusterSpec([WorkerSpec(f"w{i}", speed=0.5 if i >= 4 else 1.0) for i in range(6)], 8e6, 0.0)
    cluster.meta.update(workers_per_node=2, node_bandwidth_bps=8e7)
    if backend is not None:
        cluster.meta.update(probe={"backend": backend}) if probe else cluster.meta.update(backend=backend)
    return cluster


@pytest.mark.parametrize("backend, probe, step_s", [(None, False, 4.5), ("gloo", False, 4.5), ("nccl", False, 4.8),
                                                    ("nccl", True, 4.8)])
def test_gloo_sends_each_node_sum_as_it_lands_nccl_reduces_among_the_leaders(backend, probe, step_s):
    """One 1 MB parameter, forward 0.1 s and backward 0.2 s (node 2: 0.2 s and 0.4 s), served by
    node 0, bsp. The pull: 2 copies from the server leader (2 s) and the node stage (0.1 s).
    Node 1's sum lands 0.3 + 0.1 s after it, node 2's 0.6 + 0.1 s after. Gloo (the default,
    or `meta.backend` / the probe's): node 1's copy runs from 0.4 s, node 2's from 0.7 s
    beside it; the NIC is busy from 0.4 s for two copies: in at 2.4 s, step 2.1 + 2.4 = 4.5 s.
    NCCL: the reduce among the leaders starts once node 2's ranks hand over (0.6 s), then the
    node stage and two copies: 2.7 s, step 4.8 s."""
    r = STRATEGIES.spec("ps:hierarchical=true").simulate(synthetic_profile(
        sizes_bytes=[1_000_000], forward_time_s=0.1, backward_time_s=0.2, optimizer_time_s=0.0), late_node(backend, probe))
    assert r.step_time_s == pytest.approx(step_s, rel=1e-9)


def test_an_unknown_backend_is_one_clear_error():
    with pytest.raises(CaramelError, match=r"meta.backend must be one of gloo, nccl.*'mpi'"):
        STRATEGIES.spec("ps:hierarchical=true").simulate(synthetic_profile(sizes_bytes=[1_000], forward_time_s=0.1,
                                                                           backward_time_s=0.2), late_node("mpi"))


def test_a_comm_bound_step_is_no_shorter_than_every_nodes_reduces():
    """Asp, 3 nodes of 2 at 1 Gbit/s between nodes and 10 Mbit/s within: each node reduces all
    2.82 MB of gradients a step, one copy each at 1.25 MB/s, plus a latency per bucket (3):
    2.256 + 0.00015 s, longer than the unrolled steps' mean period (`LeaderSends.bound_s`)."""
    profile = synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                                backward_time_s=0.04, optimizer_time_s=0.002)
    cluster = ClusterSpec.uniform(6, 1e9)
    cluster.meta.update(workers_per_node=2, node_bandwidth_bps=1e7)
    r = STRATEGIES.spec("ps:hierarchical=true,consistency=asp").simulate(profile, cluster)
    assert r.meta["buckets"] == 3
    assert r.step_time_s == pytest.approx(2.82e6 / 1.25e6 + 3 * 50e-6, rel=1e-9)
    assert r.critical_path["bound"] == "communication" and max(r.meta["periods_s"]) < r.step_time_s
