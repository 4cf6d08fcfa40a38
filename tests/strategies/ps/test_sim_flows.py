"""The ps simulator's pushes as fluid flows (`sim_flows.py`): a push's rate follows how many
pushes are on the wire at each moment, from the probe's rates for 1..n pushes at once."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps import sim_flows
from caramel.strategies.ps.sim_flows import Push, check_curve, fluid_pushes
from caramel.topology.spec import ClusterSpec


def test_two_flows_share_then_the_one_left_finishes_at_full_rate():
    # each NIC at half the rate while two flow, at the full rate alone: 1 byte lands at 2 s,
    # the other's last byte alone at 3 s (the all-at-once rate throughout would say 4 s)
    spans = fluid_pushes([Push(0, 0.0, 0.0, 1.0), Push(1, 0.0, 0.0, 2.0)], 1.0, [1.0, 0.5])
    assert spans == [(0.0, 2.0), (0.0, 3.0)]
    assert fluid_pushes([Push(0, 0.0, 0.0, 1.0), Push(1, 0.0, 0.0, 2.0)], 1.0, [0.5, 0.5])[1] == (0.0, 4.0)


def test_a_servers_pushes_go_one_after_another_and_pay_their_latency_first():
    # server 0's second push waits for its first; server 1's starts alone at 0.5 s
    spans = fluid_pushes([Push(0, 0.0, 0.1, 1.0), Push(0, 0.0, 0.1, 1.0), Push(1, 0.5, 0.0, 1.0)], 1.0, [1.0, 0.5])
    # 0.1-0.5 alone (0.4 B), then shared: the first lands at 1.7; the third has 0.4 B left,
    # alone until the second's bytes flow at 1.8, then shared to 2.4; the second alone to 3.1
    expected = [(0.0, 1.7), (1.7, 3.1), (0.5, 2.4)]
    for (a, z), (ea, ez) in zip(spans, expected):
        assert a == pytest.approx(ea) and z == pytest.approx(ez)
    assert fluid_pushes([Push(0, 0.0, 0.0, 1.0)], 1.0, [1.0], {0: 2.0}) == [(2.0, 3.0)]  # the server busy before


def test_a_curve_is_one_share_per_count_of_pushes():
    assert check_curve([1, 0.5], 2) == [1.0, 0.5]
    for bad in ([1.0], [1.0, 0.0], [1.0, 1.2], "1,1", [True, 1.0], None):
        with pytest.raises(ValueError, match="push_efficiency_by_count must be 2 numbers"):
            check_curve(bad, 2)


@pytest.fixture(scope="module")
def profile():
    return synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                             backward_time_s=0.04, optimizer_time_s=0.002)


def cluster(workers: int, curve=None, queue_s=None, slowdown=1.0) -> ClusterSpec:
    c = ClusterSpec.uniform(workers, 3e8)
    c.compute_slowdown = slowdown
    c.meta.update(push_efficiency=0.6, pull_efficiency=0.7)
    if queue_s is not None:
        c.meta["link_queue_s"] = queue_s
    if curve is not None:
        c.meta["push_efficiency_by_count"] = curve
    return c


@pytest.mark.parametrize("spec,workers,queue_s,slowdown", [("ps", 4, 0.004, 1.3), ("ps", 3, None, 1.0),
                                                           ("ps:consistency=ssp:2", 4, 0.004, 1.0),
                                                           ("ps:consistency=asp", 3, 0.004, 1.3)])
def test_a_flat_curve_at_the_all_at_once_rate_predicts_what_the_old_pushes_did(profile, spec, workers, queue_s,
                                                                             slowdown):
    old = STRATEGIES.spec(spec).simulate(profile, cluster(workers, None, queue_s, slowdown)).step_time_s
    new = STRATEGIES.spec(spec).simulate(profile, cluster(workers, [0.6] * workers, queue_s, slowdown)).step_time_s
    assert new == pytest.approx(old, rel=1e-9, abs=1e-12)


def test_pushes_with_fewer_beside_them_run_faster_and_shorten_a_bsp_step(profile):
    def step(curve):
        r = STRATEGIES.spec("ps").simulate(profile, cluster(4, curve, 0.004))
        return r.step_time_s, r.meta["timeline_s"]["pushes"]
    old_s, old_pushes = step([0.6] * 4)
    new_s, new_pushes = step([1.0, 0.9, 0.8, 0.6])
    assert new_s < old_s - 0.005
    # the last push lands earlier; none lands later
    assert max(z for *_, z in new_pushes) < max(z for *_, z in old_pushes)
    assert all(z <= oz + 1e-12 for (*_, z), (*_, oz) in zip(new_pushes, old_pushes))


def test_a_bad_curve_is_one_clear_error(profile):
    with pytest.raises(CaramelError, match="push_efficiency_by_count must be 4 numbers"):
        STRATEGIES.spec("ps").simulate(profile, cluster(4, [1.0, 0.9]))


@pytest.mark.parametrize("curve", [None, [1.0, 0.9, 0.8, 0.6]])
def test_a_server_posting_its_receives_early_takes_pushes_before_its_own_gradients(profile, curve):
    # worker 0 is twice as slow: posted at its own hand-over, its shard's pushes wait for its
    # gradients; posted at its first (gloo, `push_receives_early`), they leave with the others'
    def run(**meta):
        c = cluster(4, curve, 0.004)
        c.workers[0].speed = 0.5
        c.meta.update(meta)
        r = STRATEGIES.spec("ps").simulate(profile, c)
        t = r.meta["timeline_s"]
        return r.step_time_s, [(a, t["handed"][0][b]) for b, o, a, _ in t["pushes"] if o == 0]
    late = run()
    early = run(push_receives_early=True)
    assert all(a >= h - 1e-12 for a, h in late[1])
    assert any(a < h - 1e-3 for a, h in early[1])
    # off gloo the runtime posts at the server's own push: as if not early
    assert run(push_receives_early=True, backend="nccl") == late
    with pytest.raises(CaramelError, match="push_receives_early must be true or false"):
        run(push_receives_early="yes")


def test_fluid_pushes_that_never_settle_are_counted_and_flagged(profile, monkeypatch):
    queued = cluster(4, [1.0, 0.9, 0.8, 0.6], 0.004)
    meta = STRATEGIES.spec("ps").simulate(profile, queued).meta
    assert meta["fluid_unsettled_steps"] == 0 and meta["fluid_unsettled_change_s"] == 0.0
    monkeypatch.setattr(sim_flows, "FLUID_ROUNDS", 2)  # too few for the queues and the spans to agree
    with pytest.warns(UserWarning, match="fluid pushes did not settle in 2 rounds"):
        meta = STRATEGIES.spec("ps").simulate(profile, queued).meta
    assert meta["fluid_unsettled_steps"] > 0 and meta["fluid_unsettled_change_s"] > 0.0


@pytest.mark.parametrize("spec,meta", [("ps:hierarchical=true", {"workers_per_node": 2}),
                                       ("ps:dedicated=true,servers=1", {})])
def test_a_bad_curve_is_an_error_where_the_pushes_do_not_use_it(profile, spec, meta):
    c = cluster(4, [1.0, 1.5, 0.8, 0.6])
    c.meta.update(meta)
    with pytest.raises(CaramelError, match="push_efficiency_by_count must be 4 numbers"):
        STRATEGIES.spec(spec).simulate(profile, c)
    c.meta["push_efficiency_by_count"] = [1.0, 0.9, 0.8, 0.6]
    assert STRATEGIES.spec(spec).simulate(profile, c).step_time_s > 0
