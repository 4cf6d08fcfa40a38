"""Max-min fair sharing and the fluid flow model, against hand-computed answers."""
import pytest

from caramel.sim.network import Flow, Network, max_min_rates, simulate_flows, torus_dims

pytestmark = pytest.mark.timeout(30)


def test_max_min_rates_bottleneck_then_leftover():
    caps = {"L1": 10.0, "L2": 4.0}
    # B crosses both links; L2 (shared by B and C) is the bottleneck: 2 each; A gets what L1 has left
    rates = max_min_rates([["L1"], ["L1", "L2"], ["L2"]], caps.__getitem__)
    assert rates == pytest.approx([8.0, 2.0, 2.0])


def test_max_min_rates_equal_share_and_local_flow():
    rates = max_min_rates([["L"], ["L"], ["L"], []], lambda r: 9.0)
    assert rates[:3] == pytest.approx([3.0, 3.0, 3.0])
    assert rates[3] == float("inf")


def test_two_flows_share_a_link_then_the_survivor_speeds_up():
    net = Network(2, bandwidth_bps=8000.0)  # 1000 bytes/s per NIC side
    # both 0 -> 1: 500 B/s each until the small one ends at 2 s; the big one then gets 1000 B/s
    finish = simulate_flows([Flow(0, 1, 1000.0), Flow(0, 1, 3000.0)], net)
    assert finish == pytest.approx([2.0, 4.0])


def test_late_arrival_slows_the_first_flow():
    net = Network(2, bandwidth_bps=8000.0)
    # A alone for 1 s (1000 B done), then A and B at 500 B/s: B done at 2 s, A's last 500 B at 1000 B/s
    finish = simulate_flows([Flow(0, 1, 2000.0, 0.0), Flow(0, 1, 500.0, 1.0)], net)
    assert finish == pytest.approx([2.5, 2.0])


def test_full_duplex_nics_do_not_share_directions():
    net = Network(2, bandwidth_bps=8000.0)
    finish = simulate_flows([Flow(0, 1, 1000.0), Flow(1, 0, 1000.0)], net)
    assert finish == pytest.approx([1.0, 1.0])


def test_receiver_nic_is_shared_by_incast():
    net = Network(4, bandwidth_bps=8000.0)
    finish = simulate_flows([Flow(i, 0, 1000.0) for i in (1, 2, 3)], net)
    assert finish == pytest.approx([3.0, 3.0, 3.0])


def test_zero_byte_and_empty_flow_lists():
    net = Network(2, bandwidth_bps=8000.0)
    assert simulate_flows([], net) == []
    assert simulate_flows([Flow(0, 1, 0.0, 1.5)], net) == [1.5]


def test_ring_topology_routes_the_short_way_and_shares_links():
    net = Network(6, bandwidth_bps=8000.0, topology="ring")
    assert net.route(0, 2) == (("link", 0, 1), ("link", 1, 2))
    assert net.route(0, 5) == (("link", 0, 5),)
    # 0->2 and 1->2 both use link 1->2
    finish = simulate_flows([Flow(0, 2, 1000.0), Flow(1, 2, 1000.0)], net)
    assert finish == pytest.approx([2.0, 2.0])


def test_torus_dims_and_neighbours():
    assert torus_dims(16) == (4, 4)
    assert torus_dims(12) == (3, 4)
    assert torus_dims(7) == (1, 7)
    net = Network(16, 1e9, topology="torus")
    assert net.neighbours(0) == [1, 3, 4, 12]
    assert len(net.route(0, 10)) == 4  # two row hops, two column hops


def test_servers_hang_off_the_switch():
    net = Network(4, 1e9, topology="ring", extra_nodes=2)
    assert net.route(0, 5) == (("tx", 0), ("rx", 5))
