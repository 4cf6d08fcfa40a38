"""The ps simulator's links: a serving rank's pushes and pulls share its connections.

Colocated flat servers push on their own shard's pull group (`PsEngine.link_group`): on each
link a rank's pushes and pulls leave one after another; hierarchical leaders share their NIC
the same way. Under ssp/asp the old model let them run side by side at full rate each, so a
comm-bound rank sent twice what its link carries.
"""
from __future__ import annotations

import pytest

from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps.sim_links import Links
from caramel.topology.spec import ClusterSpec


def sim(spec: str, profile, cluster):
    return STRATEGIES.spec(spec).simulate(profile, cluster)


def hier(workers: int, rate_bps: float) -> ClusterSpec:
    """Two workers per node, a fast link within the node: the leaders' NICs are the bottleneck."""
    cluster = ClusterSpec.uniform(workers, rate_bps)
    cluster.meta.update(workers_per_node=2, node_bandwidth_bps=1e10)
    return cluster


@pytest.fixture(scope="module")
def profile():
    return synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                             backward_time_s=0.04, optimizer_time_s=0.002)


@pytest.mark.parametrize("spec", ["ps:consistency=ssp:2", "ps:consistency=asp", "ps:consistency=ssp:1,order=random",
                                  "ps:consistency=ssp:2,hierarchical=true", "ps:consistency=asp,hierarchical=true"])
def test_a_comm_bound_rank_sends_its_pushes_and_pulls_on_one_link(profile, spec):
    """2 workers (or 2 nodes of 2): each serving rank sends the other shard's gradient (its
    push; a leader its node's sum) and its own shard (its pull) every step, one copy each: the
    whole model through its link, whatever the staleness. The separate-link model predicted
    0.1425 s for flat ssp:2 here and 0.144 s for hierarchical, 63-64% of that."""
    rate_bps = 1e8
    cluster = hier(4, rate_bps) if "hierarchical" in spec else ClusterSpec.uniform(2, rate_bps)
    r = sim(spec, profile, cluster)
    model_s = sum(p.bytes for p in profile.trainable()) * 8 / rate_bps
    assert r.step_time_s >= model_s
    assert r.step_time_s <= model_s * 1.1 + profile.step_time_s  # not serialized beyond the link


@pytest.mark.parametrize("spec", ["ps:consistency=ssp:2", "ps:consistency=ssp:2,hierarchical=true"])
def test_no_serving_rank_sends_a_pull_beside_its_own_push(profile, spec):
    """Under ssp the steady step's pushes and the pulls before them are on the wire at once; no
    push may overlap a pull of one of its senders (every server but the push's own; hierarchical:
    shards are nodes, 3 of 2 workers each)."""
    r = sim(spec, profile, hier(6, 3e8) if "hierarchical" in spec else ClusterSpec.uniform(3, 3e8))
    tl = r.meta["timeline_s"]
    pulls = tl["pulls_before"]
    assert pulls and tl["pushes"]
    for _, owner, a, z in tl["pushes"]:
        for _, server, pa, pz in pulls:
            if server != owner:  # the pulling server is one of this push's senders
                assert z <= pa + 1e-12 or pz <= a + 1e-12, (owner, a, z, server, pa, pz)


@pytest.mark.parametrize("spec", ["ps:consistency=ssp:2", "ps:consistency=ssp:2,hierarchical=true"])
def test_no_pull_leaves_beside_its_servers_own_pushes(profile, spec):
    """Under ssp a stale update's pulls are handed over at step(), after that step's pushes: a
    server's pulls wait for the pushes it sent (to every other shard) before they leave."""
    r = sim(spec, profile, hier(6, 3e8) if "hierarchical" in spec else ClusterSpec.uniform(3, 3e8))
    tl = r.meta["timeline_s"]
    pulls = tl["pulls_before"] + tl["pulls_after"]
    assert tl["pulls_after"] and tl["pushes"]
    for _, server, pa, pz in pulls:
        for _, owner, a, z in tl["pushes"]:
            if owner != server:  # the pulling server sent this push
                assert pz <= a + 1e-12 or z <= pa + 1e-12, (server, pa, pz, owner, a, z)


def test_bsp_predictions_are_unchanged_by_the_shared_links(profile):
    """Under bsp a rank's pulls follow every push and the next pushes follow the forward that
    waited for every pull: the rule never binds. Values of the separate-link model (def9d28);
    hierarchical on gloo, of the leaders' direct sends with the rule never binding (each
    equal with `Links.pull_start` a no-op and no pulls ahead of a leader's sends), and on NCCL,
    of the collective among the leaders (4b89033)."""
    pinned = [("ps", ClusterSpec.uniform(2, 1e8), 0.3101921985815606),
              ("ps:order=random", ClusterSpec.uniform(4, 3e8), 0.1902624113475179)]
    queued = ClusterSpec.uniform(4, 3e8, compute_slowdown=1.4)
    queued.meta.update(link_queue_s=0.005, push_efficiency=0.6, pull_efficiency=0.8)
    pinned.append(("ps:order=tic", queued, 0.2665134751773051))
    nccl = [hier(4, 1e8), hier(6, 3e8)]
    for c in nccl:
        c.meta.update(backend="nccl")
    pinned += [("ps:hierarchical=true", hier(4, 1e8), 0.3125981985815605),
               ("ps:hierarchical=true,order=random", hier(6, 3e8), 0.17298368794326238),
               ("ps:hierarchical=true", nccl[0], 0.3134401985815605),
               ("ps:hierarchical=true,order=random", nccl[1], 0.16116524822695033)]
    for spec, cluster, step_s in pinned:
        assert sim(spec, profile, cluster).step_time_s == pytest.approx(step_s, rel=1e-12), spec


def test_links_order_a_ranks_transfers_as_handed_over():
    links = Links(ranks=3, serving=2)
    pulls_end = [5.0, 7.0]  # per shard: when its server's pulls handed over so far leave
    # a push to shard 0 is sent by ranks 1 and 2; only rank 1 serves (and pulls until 7 s)
    assert links.push_start(1.0, owner=0, pulls_end=pulls_end) == 7.0
    assert links.push_start(9.0, owner=1, pulls_end=pulls_end) == 9.0
    links.pushed(owner=0, end_s=8.0)  # ranks 1 (serving) and 2 (not) sent it
    assert links.pushes_end == [0.0, 8.0, 0.0]
    assert links.pull_start(2.0, server=1) == 8.0 and links.pull_start(2.0, server=0) == 2.0
