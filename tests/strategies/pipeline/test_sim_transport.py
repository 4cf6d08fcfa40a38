"""The pipeline simulator's transfers as the schedules post them (gloo's rendezvous), on timelines
computed by hand: forward 1, backward 2, a transfer 0.5 (latency 0.1 of it), two stages."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.strategies.pipeline.auto_replicas import choose_replicas
from caramel.strategies.pipeline.microbatches import choose_microbatches
from caramel.strategies.pipeline.overlap import replay_overlapped
from caramel.strategies.pipeline.planner import ScalingCost
from caramel.strategies.pipeline.replay import replay, replicated_actions, schedule_actions
from caramel.strategies.pipeline.timeline import ReduceBuckets, StageCosts
from caramel.strategies.pipeline.transport import TRANSPORTS, lane_programs
from caramel.topology.spec import ClusterSpec

COSTS = StageCosts([1.0, 1.0], [2.0, 2.0], [0.5], latency_s=0.1)


def test_1f1b_sends_an_activation_only_once_the_receiver_posts_its_recv():
    acts = schedule_actions("1f1b", 2, 2, 2)
    # eager: stage 0 sends F1 at 2 (lands 2.5); stage 1 runs F0 1.5-2.5, B0 2.5-4.5, F1 4.5-5.5,
    # B1 5.5-7.5 (gradient lands 8.0); stage 0's B0 5.0-7.0, B1 8.0-10.0
    assert replay(COSTS, acts).step_time_s == pytest.approx(10.0)
    # torch's 1F1B: stage 1 posts F1's recv with B0's send, at 4.5; the notice reaches stage 0 at
    # 4.6, F1 lands 5.1: stage 1's F1 5.1-6.1, B1 6.1-8.1, lands 8.6; stage 0 (waiting for F1's
    # send and B0 together until 5.1) B0 5.1-7.1, B1 8.6-10.6
    sim = replay(COSTS, acts, posting="1f1b")
    assert sim.step_time_s == pytest.approx(10.6)
    assert sim.finish_s == pytest.approx([10.6, 8.6])


def test_gpipe_receiver_posts_each_recv_after_its_previous_action():
    acts = schedule_actions("gpipe", 2, 2, 2)
    assert replay(COSTS, acts).step_time_s == pytest.approx(10.0)
    # F1's recv posted at 2.5 (after stage 1's F0): lands 3.1; stage 1 F1 3.1-4.1, B0 4.1-6.1
    # (lands 6.6), B1 6.1-8.1; stage 0 posts B1's recv after its B0 (6.6-8.6): lands 9.2, B1 9.2-11.2
    sim = replay(COSTS, acts, posting="gpipe")
    assert sim.step_time_s == pytest.approx(11.2)
    assert sim.finish_s == pytest.approx([11.2, 9.2])


def test_compute_slowdown_moves_the_step_only_through_a_sender_on_the_critical_path():
    acts = schedule_actions("gpipe", 2, 2, 2)
    # equal stages: stage 0's F1 runs beside F0's transfer (1-1.5): 1-2.25, sent at 2.25, but
    # stage 1 posts F1's recv only at 2.5 (after its F0), so F1 lands at 3.1 as with f = 1;
    # stage 1's B1 beside B0's transfer (6.1-6.6) ends at 8.35, but stage 0 posts at 8.6
    sim = replay(COSTS, acts, compute_slowdown=2.0, posting="gpipe")
    assert sim.step_time_s == pytest.approx(11.2)
    assert sim.busy_s == pytest.approx([6.25, 6.25])
    # stage 0 the slower (F 2, B 2 against 1, 1): stage 1 has posted F1's recv at 3.5 when stage 0
    # sends it. f = 1: F1 sent at 4, lands 4.5; stage 1 F1 4.5-5.5, B0 5.5-6.5, B1 6.5-7.5; stage 0
    # B0 7.0-9.0, posts B1's recv at 9.0, B1 lands 9.6, runs 9.6-11.6
    slow0 = StageCosts([2.0, 1.0], [2.0, 1.0], [0.5], latency_s=0.1)
    assert replay(slow0, acts, posting="gpipe").step_time_s == pytest.approx(11.6)
    # f = 2: stage 0's F1 runs its first 0.5 s beside F0's transfer (2-2.5) at half speed: 2-4.25,
    # lands 4.75, and everything after moves by 0.25 (stage 1's B1 beside B0's transfer 6.75-7.25
    # ends at 8.0, before stage 0 posts B1's recv at 9.25): B1 lands 9.85, stage 0 ends 11.85
    sim = replay(slow0, acts, compute_slowdown=2.0, posting="gpipe")
    assert sim.step_time_s == pytest.approx(11.85)
    assert sim.busy_s == pytest.approx([8.25, 4.25])


def test_an_order_other_than_the_schedules_is_an_error():
    alternating = [[(s, k, i) for i in range(2) for k in "FB"] for s in range(2)]
    # torch's 1F1B runs min(m, p - s) = 2 warmup forwards on stage 0 before its first backward
    with pytest.raises(CaramelError, match=r"stage 0's actions are not in 1f1b's order"):
        lane_programs("1f1b", alternating, 2)
    with pytest.raises(CaramelError, match=r"stage 0's actions are not in gpipe's order"):
        lane_programs("gpipe", alternating, 2)
    lane_programs("1f1b", schedule_actions("1f1b", 2, 2, 2), 2)  # the runtime's own orders pass
    lane_programs("gpipe", schedule_actions("gpipe", 2, 2, 2), 2)


@pytest.mark.parametrize("transport", ["bogus", "Rendezvous"])
def test_the_choosers_name_an_unknown_transport(transport):
    layers, cluster = [ScalingCost(0.0, 1e-3, 0.0, 1e-3, 10, 10)] * 2, ClusterSpec.uniform(2, 1e9)
    allowed = str(TRANSPORTS).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(CaramelError, match=rf"microbatches=auto: transport must be one of {allowed}, got '{transport}'"):
        choose_microbatches(layers, 8, "gpipe", 2, 2, cluster, transport=transport)
    with pytest.raises(CaramelError, match=rf"replicas=auto: transport must be one of {allowed}, got '{transport}'"):
        choose_replicas(layers, 8, "gpipe", cluster, transport=transport)


@pytest.mark.parametrize("posting", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (3, 7)])
def test_free_transfers_keep_the_closed_form(posting, p, m):
    sim = replay(StageCosts([1.0] * p, [2.0] * p, [0.0] * (p - 1)), schedule_actions(posting, p, p, m), posting=posting)
    assert sim.step_time_s == pytest.approx((m + p - 1) * 3.0)


def test_interleaved_and_unequal_replicas_run_their_own_order():
    costs = StageCosts([0.5] * 4, [1.0] * 4, [0.0] * 3)
    acts = schedule_actions("interleaved", 4, 2, 4)
    assert replay(costs, acts, posting="interleaved").step_time_s == pytest.approx(replay(costs, acts).step_time_s)
    lanes = replicated_actions("1f1b", (2, 1), 4)
    free = StageCosts([2.0, 1.0], [2.0, 1.0], [0.0])
    assert replay(free, lanes, period=2, posting="1f1b").step_time_s == pytest.approx(
        replay(free, lanes, period=2).step_time_s)
    # a stage-0 replica's transfer waits for the shared stage-1 rank to reach its virtual pipeline
    slow = StageCosts([2.0, 1.0], [2.0, 1.0], [0.3], latency_s=0.1)
    assert replay(slow, lanes, period=2, posting="1f1b").step_time_s > replay(slow, lanes, period=2).step_time_s


def test_the_overlapped_replay_takes_the_same_posting():
    none = ReduceBuckets([], [], [], [], [])
    costs = StageCosts([1.0, 1.0], [2.0, 2.0], [0.5], [], [], [none, none], latency_s=0.1)
    one = replay_overlapped(costs, schedule_actions("1f1b", 2, 2, 2), "forward", steps=1, posting="1f1b")
    assert one.step_time_s == pytest.approx(10.6)


def test_bad_postings_and_deadlocks_are_errors():
    with pytest.raises(CaramelError, match="posting must be one of"):
        lane_programs("bogus", schedule_actions("gpipe", 2, 2, 2), 2)
    with pytest.raises(CaramelError, match="deadlocks"):
        # pipedream posts per action and takes any order: stage 1 waits for a forward never run
        replay(COSTS, [[(0, "B", 0)], [(1, "F", 0), (1, "B", 0)]], posting="pipedream")
