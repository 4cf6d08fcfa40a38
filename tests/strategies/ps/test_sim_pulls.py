"""The ps simulator's pulls as fluid flows (`sim_pulls.py`): a pull's rate follows how many
broadcasts are on the wire, from the probe's rates for 1..n servers broadcasting at once."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps import sim_flows
from caramel.strategies.ps.sim_pulls import check_pull_curve, fluid_pulls, pull_curve_caps
from caramel.strategies.recommend import predict
from caramel.topology.spec import ClusterSpec

RESULTS = Path(__file__).resolve().parents[3] / "docs/results"


def test_two_pulls_share_then_the_one_left_runs_at_its_lone_rate_which_may_beat_the_roots_copies():
    # alone a broadcast goes at 1.5x the root's copies (a tree), two at once at 0.5 each: the 1 B
    # pull lands at 2 s; the other has 1 B left, alone at 1.5 B/s: 2 + 2/3 s (all at once: 4 s)
    flows = fluid_pulls([0, 1], [0, 1], [1.0, 2.0], [0.0, 0.0], [0.0, 0.0], None, 0.0, 1.0, [1.5, 0.5], {})
    assert flows.settled and flows.spans[0] == pytest.approx((0.0, 2.0))
    assert flows.spans[1] == pytest.approx((0.0, 2.0 + 2.0 / 3.0))
    # in hand-over order, a server's second pull after its first, latency first; busy before
    flows = fluid_pulls([1, 0], [0, 0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], None, 0.1, 1.0, [1.0, 0.5], {0: 1.0})
    assert [x for span in flows.spans for x in span] == pytest.approx([1.0, 2.1, 2.1, 3.2])



def test_a_pulls_ready_notes_wait_behind_the_receivers_egress_or_earlier_pulls_then_the_servers_ingress():
    from caramel.strategies.ps.queues import Queues

    # 2 workers, 1 B/s, every share 1, no latency. Rank 1's note for server 0's pull waits behind
    # rank 1's egress (0.3 s) and then server 0's ingress (0.5 s): the pull starts at 0.8
    q = Queues(2)
    q.egress[1].add(0.0, 0.3)
    q.ingress[0].add(0.0, 0.5)
    flows = fluid_pulls([0], [0], [1.0], [0.0], [0.0, 0.0], q, 0.0, 1.0, [1.0, 1.0], {})
    assert flows.settled and flows.spans == [pytest.approx((0.8, 1.8))]
    # rank 0 sends server 0's pull over [0, 1]; its note for server 1's pull waits behind that pull
    # (1 s), not its older egress (0.2 s) as well: the longer of the two, 1.0
    q = Queues(2)
    q.egress[0].add(0.0, 0.2)
    flows = fluid_pulls([0, 1], [0, 1], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], q, 0.0, 1.0, [1.0, 1.0], {})
    assert flows.settled and flows.spans == [pytest.approx((0.0, 1.0)), pytest.approx((1.0, 2.0))]


def test_a_pull_curve_is_one_share_per_count_capped_where_the_links_stop():
    # a rank that broadcasts none receives k copies: (n - 1) / k; every rank broadcasting: n - 1 copies each
    assert pull_curve_caps(4) == pytest.approx([3.0, 1.5, 1.0, 1.0])
    assert pull_curve_caps(2) == [1.0, 1.0] and all(isinstance(c, float) for c in pull_curve_caps(2))
    assert check_pull_curve([1.5, 1.2, 1.0, 0.7], 4) == [1.5, 1.2, 1.0, 0.7]
    for bad in ([1.0, 1.0, 1.0], [3.5, 1.0, 1.0, 0.7], [1.5, 1.2, 1.0, 1.1], [1.0, 0.0, 1.0, 0.7], "1", None,
                [1.5, 1.6, 1.0, 0.7], [1.5, 1.2, 1.1, 0.7]):
        with pytest.raises(ValueError, match="pull_efficiency_by_count must be 4 numbers in"):
            check_pull_curve(bad, 4)


@pytest.fixture(scope="module")
def profile():
    return synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                             backward_time_s=0.04, optimizer_time_s=0.002)


def cluster(workers: int, pull_curve=None, queue_s=None, slowdown=1.0, push_curve=None) -> ClusterSpec:
    c = ClusterSpec.uniform(workers, 3e8)
    c.compute_slowdown = slowdown
    c.meta.update(push_efficiency=0.6, pull_efficiency=0.7)
    for key, value in (("link_queue_s", queue_s), ("pull_efficiency_by_count", pull_curve),
                       ("push_efficiency_by_count", push_curve)):
        if value is not None:
            c.meta[key] = value
    return c


@pytest.mark.parametrize("spec,workers,queue_s,slowdown,pushes", [
    ("ps", 4, 0.004, 1.3, None), ("ps", 3, None, 1.0, [1.0, 0.8, 0.6]),
    ("ps:consistency=ssp:2", 4, 0.004, 1.0, [1.0, 0.9, 0.8, 0.6]), ("ps:consistency=asp", 3, 0.004, 1.3, None),
    ("ps:pull_bucket_cap_mb=0.3", 4, 0.004, 1.3, [1.0, 0.9, 0.8, 0.6])])
def test_a_flat_pull_curve_at_the_all_at_once_rate_predicts_what_the_old_pulls_did(profile, spec, workers, queue_s,
                                                                                 slowdown, pushes):
    old = STRATEGIES.spec(spec).simulate(profile, cluster(workers, None, queue_s, slowdown, pushes))
    new = STRATEGIES.spec(spec).simulate(profile, cluster(workers, [0.7] * workers, queue_s, slowdown, pushes))
    assert new.step_time_s == pytest.approx(old.step_time_s, rel=1e-9, abs=1e-12)
    assert new.meta["fluid_pull_unsettled_steps"] == 0 and "fluid_pull_unsettled_steps" not in old.meta


def test_a_bsp_steps_pulls_follow_the_hand_computed_fluid_schedule(profile):
    # 3 workers, one pull bucket per shard (the default caps), no queues or contention: the three pulls start
    # together; while k flow each goes at curve[k - 1] of the rate, so the smallest lands first
    curve = [1.5, 0.9, 0.7]
    r = STRATEGIES.spec("ps").simulate(profile, cluster(3, curve))
    pulls = r.meta["timeline_s"]["pulls_after"]
    assert len(pulls) == 3 and len({a for _, _, a, _ in pulls}) == 1
    start = pulls[0][2]
    size = {p.index: p.bytes for p in profile.params}
    sizes = sorted(2 * sum(size[i] for i in b) for b in _pull_buckets(profile))  # each server's NIC: 2 copies
    Bps, alpha = 3e8 / 8, ClusterSpec.uniform(3, 3e8).latency_s
    t, done, ends = start + alpha, 0.0, []
    for k, s in enumerate(sizes):  # 3, then 2, then 1 in flight
        t += (s - done) / (Bps * curve[2 - k])
        done = s
        ends.append(t)
    assert sorted(z for *_, z in pulls) == pytest.approx(ends, rel=1e-9)
    # the old pulls, every one at the all-at-once rate, all land later but the first
    old = STRATEGIES.spec("ps").simulate(profile, cluster(3)).meta["timeline_s"]["pulls_after"]
    assert max(z for *_, z in old) - old[0][2] > max(ends) - start + 1e-3


def _pull_buckets(profile):
    from caramel.strategies.ps.planner import make_ps_plan

    opts = STRATEGIES.spec("ps").options
    return make_ps_plan(profile, opts, 3, ClusterSpec.uniform(3, 3e8).latency_s, 3e8 / 8).pull_buckets


def test_a_stored_run_without_the_pull_curve_replays_its_recorded_predictions_to_the_bit():
    # the newest stored run (fluid pushes, early receives): every ps row as the bench predicted it
    for w in ("w2", "w4"):
        d = json.loads((RESULTS / f"ps_sim_flow_fresh3/{w}/bench.json").read_text())
        (pi,) = d["meta"]["prediction_inputs"].values()
        prof, c = ModelProfile.from_dict(pi["profile"]), ClusterSpec.from_dict(pi["clusters"]["base"])
        assert "pull_efficiency_by_count" not in c.meta
        rows = [r for r in d["records"] if r["strategy"].startswith("ps")]
        assert rows and all(predict(prof, c, [r["strategy"]])[0].step_time_s == r["predicted_step_s"] for r in rows)


def test_a_bad_pull_curve_is_one_clear_error_on_every_path(profile):
    for spec, meta in (("ps", {}), ("ps:hierarchical=true", {"workers_per_node": 2}),
                       ("ps:dedicated=true,servers=1", {})):
        c = cluster(4, [1.0, 2.5, 1.0, 0.7])
        c.meta.update(meta)
        with pytest.raises(CaramelError, match="pull_efficiency_by_count must be 4 numbers"):
            STRATEGIES.spec(spec).simulate(profile, c)


def test_fluid_pulls_that_never_settle_are_counted_and_flagged(profile, monkeypatch):
    queued = cluster(4, [1.5, 1.2, 1.0, 0.7], 0.004)
    monkeypatch.setattr(sim_flows, "FLUID_ROUNDS", 1)  # one round cannot show two agreeing
    with pytest.warns(UserWarning, match="fluid pulls did not settle in 1 rounds"):
        meta = STRATEGIES.spec("ps").simulate(profile, queued).meta
    assert meta["fluid_pull_unsettled_steps"] > 0 and "fluid_unsettled_steps" not in meta
