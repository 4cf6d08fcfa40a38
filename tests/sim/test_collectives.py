"""Closed forms against message-level simulation with link sharing (zero compute)."""
import math

import pytest

from caramel.topology.spec import ClusterSpec
from caramel.sim.collectives import COLLECTIVE_MODELS, CommModel, closed_form_s, message_level_s

pytestmark = pytest.mark.timeout(60)

SIZES = [2, 3, 4, 5, 7, 8, 16]


@pytest.mark.parametrize("collective", sorted(COLLECTIVE_MODELS))
@pytest.mark.parametrize("topology", ["switch", "fully_connected"])
@pytest.mark.parametrize("n", SIZES)
def test_message_level_matches_closed_form(collective, topology, n):
    for servers in ((1, 2, 3) if collective == "ps" else (1,)):
        c = ClusterSpec.uniform(n, 1e9, 20e-6, collective=collective, topology=topology, num_servers=servers)
        for nbytes in (0.0, 1234.0, 4e6):
            assert message_level_s(c, nbytes) == pytest.approx(closed_form_s(c, nbytes), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("n", SIZES + [64])
def test_ring_is_the_textbook_formula(n):
    a, B, S = 30e-6, 10e9, 8e6
    c = ClusterSpec.uniform(n, B, a)
    want = 2 * (n - 1) * a + 2 * (n - 1) / n * S * 8 / B
    assert message_level_s(c, S) == pytest.approx(want, rel=1e-12)
    assert closed_form_s(c, S) == pytest.approx(want, rel=1e-12)
    assert c.allreduce_time_s(S) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("topology", ["ring", "torus"])
def test_ring_allreduce_on_direct_links_matches_too(topology):
    c = ClusterSpec.uniform(12, 1e9, 10e-6, topology=topology)
    assert message_level_s(c, 1e6) == pytest.approx(closed_form_s(c, 1e6), rel=1e-9)


def test_gossip_through_one_nic_costs_degree_times_more():
    S, B = 1e6, 1e9
    switch = ClusterSpec.uniform(8, B, 0.0, collective="gossip", topology="switch")
    ring = ClusterSpec.uniform(8, B, 0.0, collective="gossip", topology="ring")
    torus = ClusterSpec.uniform(16, B, 0.0, collective="gossip", topology="torus")
    assert message_level_s(switch, S) == pytest.approx(2 * S * 8 / B)
    assert message_level_s(ring, S) == pytest.approx(S * 8 / B)
    assert message_level_s(torus, S) == pytest.approx(S * 8 / B)
    assert closed_form_s(torus, S) == pytest.approx(S * 8 / B)


def test_halving_doubling_on_a_ring_suffers_contention():
    c = ClusterSpec.uniform(8, 1e9, 0.0, collective="halving_doubling", topology="ring")
    assert message_level_s(c, 1e6) > closed_form_s(c, 1e6) * 1.5


def test_ps_with_few_servers_is_server_bound():
    n, S, B = 8, 1e6, 1e9
    c = ClusterSpec.uniform(n, B, 0.0, collective="ps", num_servers=2)
    assert message_level_s(c, S) == pytest.approx(2 * n * S * 8 / (2 * B))
    c = ClusterSpec.uniform(n, B, 0.0, collective="ps", num_servers=8)
    assert message_level_s(c, S) == pytest.approx(2 * S * 8 / B)


def test_tree_and_hd_latency_terms():
    c = ClusterSpec.uniform(5, 1e9, 1e-3, collective="tree")
    assert closed_form_s(c, 0.0) == pytest.approx(2 * 3 * 1e-3)  # ceil(log2 5) = 3 rounds each way
    c = ClusterSpec.uniform(6, 1e9, 1e-3, collective="halving_doubling")
    assert message_level_s(c, 0.0) == pytest.approx(2 * 2 * 1e-3 + 2 * 1e-3)  # p = 4, plus fold and unfold


def test_one_worker_costs_nothing():
    for coll in COLLECTIVE_MODELS:
        c = ClusterSpec.uniform(1, 1e9, 1e-3, collective=coll)
        assert message_level_s(c, 1e6) == 0.0 and closed_form_s(c, 1e6) == 0.0
        assert CommModel(c).time_s(1e6) == 0.0


@pytest.mark.parametrize("collective", sorted(COLLECTIVE_MODELS))
def test_comm_model_is_affine_and_matches_direct_simulation(collective):
    c = ClusterSpec.uniform(6, 2e9, 15e-6, collective=collective, topology="ring", num_servers=2)
    m = CommModel(c)
    for nbytes in (1.0, 777.0, 3.3e6):
        assert m.time_s(nbytes) == pytest.approx(message_level_s(c, nbytes), rel=1e-9)
    closed = CommModel(c, "closed")
    assert closed.time_s(5e5) == pytest.approx(closed_form_s(c, 5e5), rel=1e-9)


def test_large_ring_is_one_phase():
    c = ClusterSpec.uniform(1024, 10e9, 50e-6)
    m = CommModel(c)
    assert m.steps == 2 * 1023
    assert m.time_s(1e8) == pytest.approx(closed_form_s(c, 1e8), rel=1e-9)
    assert math.isclose(m.sent_per_byte, 2 * 1023 / 1024, rel_tol=1e-12)
