"""The event engine against hand-computed 2-worker timelines."""
import pytest

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError, FormatError, MismatchError
from caramel.strategies.planners import make_plan
from caramel.sim import simulate
from caramel.sim.synthetic import synthetic_profile
from caramel.trace.events import Trace

from .helpers import slow_link_cluster, two_bucket_plan, two_layer_profile

pytestmark = pytest.mark.timeout(60)


def _events(trace, rank, name, iteration):
    return [e for e in trace.events if e.rank == rank and e.name == name and e.iteration == iteration]


def test_forward_overlap_hand_timeline():
    # step 0: fwd 0-1, bwd 1-3, b0 ready 2.0 and b1 ready 3.0; collectives take 1.2 s:
    #   b0 2.0-3.2, b1 3.2-4.4. step() returns at 3.0.
    # step 1: fwd from 3.0 needs b1 at once: wait 3.0-4.4, apply 0.1, 0.5 of forward, b0 done: apply 0.1,
    #   0.5 of forward -> 5.6; bwd 5.6-7.6; b0 6.6-7.8, b1 7.8-9.0. Period 7.6 - 3.0 = 4.6.
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof), overlap="forward", iterations=4)
    assert res.step_time_s == pytest.approx(4.6)
    assert res.iteration_times_s == pytest.approx([3.0, 4.6, 4.6, 4.6])
    assert res.compute_time_s == pytest.approx(3.2)
    assert res.exposed_comm_s == pytest.approx(1.4)
    assert res.comm_time_s == pytest.approx(2.4)
    assert res.wait_time_s == pytest.approx(1.4)
    assert res.critical_path["bound"] == "communication"
    assert res.critical_path["top_waits"][0]["bucket"] == 1
    t = res.trace
    assert t.source == "predicted" and t.world_size == 2
    for rank in (0, 1):
        (fwd,) = _events(t, rank, "forward", 1)
        assert (fwd.start_s, fwd.duration_s) == pytest.approx((3.0, 2.6))
        (wait,) = _events(t, rank, "wait:b1", 1)
        assert (wait.start_s, wait.duration_s, wait.lane, wait.bucket) == pytest.approx((3.0, 1.4, "wait", 1))
        assert _events(t, rank, "wait:b0", 1) == []
        (apply1,) = _events(t, rank, "apply:b1", 1)
        assert (apply1.start_s, apply1.duration_s, apply1.kind) == pytest.approx((4.4, 0.1, "optimizer"))
        (comm,) = _events(t, rank, "allreduce:b0c0", 1)
        assert (comm.start_s, comm.end_s, comm.bytes, comm.lane) == pytest.approx((6.6, 7.8, 1000, "comm"))
        (ready,) = _events(t, rank, "ready:b1", 1)
        assert (ready.start_s, ready.duration_s, ready.kind) == pytest.approx((7.6, 0.0, "ready"))
        (bwd,) = _events(t, rank, "backward", 1)
        assert (bwd.start_s, bwd.duration_s) == pytest.approx((5.6, 2.0))
    # optimizer.synchronize() after the last step applies what is pending
    last = [e for e in t.events if e.rank == 0 and e.iteration == 4]
    assert {e.name for e in last} == {"wait:b1", "apply:b0", "apply:b1"}


def test_queued_collective_pays_the_queued_latency_hand_timeline():
    # alpha 0.1 per message on an idle link (0.2 a collective: 2 ring steps), at least 0.02 per
    # message (0.04) queued behind another; 1000 bytes take 1.0 s.
    # step 0: b0 ready 2.0 on an idle link: 2.0-3.2; b1 ready 3.0, before b0 is done: queued,
    #   3.2-4.24 (1.04). step 1: fwd from 3.0 waits for b1 to 4.24, apply 0.1, 0.5 of forward,
    #   apply b0 0.1, 0.5 -> 5.44; bwd 5.44-7.44; b0 ready 6.44 on a link idle since 4.24: the
    #   whole alpha again, 6.44-7.64; b1 ready 7.44, queued: 7.64-8.68. Period 7.44 - 3.0 = 4.44.
    prof = two_layer_profile()
    cluster = slow_link_cluster()
    cluster.queued_latency_s = 0.02
    res = simulate(prof, cluster, two_bucket_plan(prof), overlap="forward", iterations=4)
    assert res.step_time_s == pytest.approx(4.44)
    assert res.comm_time_s == pytest.approx(1.2 + 1.04)
    for rank in (0, 1):
        (b0,) = _events(res.trace, rank, "allreduce:b0c0", 1)
        (b1,) = _events(res.trace, rank, "allreduce:b1c0", 1)
        assert (b0.end_s, b1.start_s, b1.end_s) == pytest.approx((7.64, 7.44, 8.68))
    # without a queued latency, every collective pays the whole alpha (the timeline above: 4.6)
    cluster.queued_latency_s = None
    assert simulate(prof, cluster, two_bucket_plan(prof), overlap="forward").step_time_s == pytest.approx(4.6)


def test_only_what_is_left_of_the_previous_transfer_hides_a_queued_latency():
    # 1000 bytes take 0.81 s: b0 2.0-3.01; b1 issued at 3.0 has 0.01 s of b0 left to hide behind,
    # so it pays 0.2 - 0.01 = 0.19 of its 0.2 (not the 0.04 floor): 3.01-4.01
    prof = two_layer_profile()
    cluster = slow_link_cluster()
    cluster.bandwidth_bps, cluster.queued_latency_s = 8000.0 / 0.81, 0.02
    res = simulate(prof, cluster, two_bucket_plan(prof), overlap="backward", iterations=2)
    (b0,) = _events(res.trace, 0, "allreduce:b0c0", 0)
    (b1,) = _events(res.trace, 0, "allreduce:b1c0", 0)
    assert b0.end_s == pytest.approx(3.01) and b1.end_s == pytest.approx(4.01)


def test_a_queued_collective_hides_its_latency_behind_the_previous_transfer():
    # 4 workers, alpha 1 ms per step (6 steps: 6 ms a collective on an idle link), at least
    # 0.1 ms per step queued; every collective is issued at once (no compute), so all but the
    # first of a step are queued. Behind a large transfer the queued part is left; behind a
    # tiny one nearly the whole latency.
    prof = synthetic_profile(4, sizes_bytes=[4_000_000, 1000, 1000, 4_000_000], forward_time_s=0.0,
                             backward_time_s=0.0, optimizer_time_s=0.0)
    c = ClusterSpec.uniform(4, 1e9, 1e-3, queued_latency_s=1e-4)
    plan = make_plan("fifo", prof, c, bucket_cap_mb=0.0001, first_bucket_mb=0.0001)
    sizes = [plan.buckets[b].chunk_bytes(ch) for b, ch in plan.order]
    assert sorted(sizes) == [1000, 1000, 4_000_000, 4_000_000]
    res = simulate(prof, c, plan, overlap="backward", comm="closed")
    transfer = [1.5 * s * 8 / 1e9 for s in sizes]  # 2(n-1)/n * S / B
    want = 6e-3 + transfer[0]
    for k in range(1, len(sizes)):
        want += max(6e-4, 6e-3 - transfer[k - 1]) + transfer[k]
    assert res.step_time_s == pytest.approx(want, rel=1e-9)
    assert res.comm_time_s == pytest.approx(want, rel=1e-9)
    # each collective paying the whole latency takes longer
    c.queued_latency_s = None
    assert simulate(prof, c, plan, overlap="backward", comm="closed").step_time_s == pytest.approx(4 * 6e-3 + sum(transfer))


def test_backward_overlap_hand_timeline():
    # step: fwd 0-1, bwd 1-3, b0 2.0-3.2, b1 3.2-4.4, wait at step() 3.0-4.4, apply 0.2 -> 4.6
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof), overlap="backward", iterations=3)
    assert res.iteration_times_s == pytest.approx([4.6, 4.6, 4.6])
    assert res.step_time_s == pytest.approx(4.6)
    waits = _events(res.trace, 0, "wait:b0", 1) + _events(res.trace, 0, "wait:b1", 1)
    assert [x for w in waits for x in (w.start_s, w.end_s)] == pytest.approx([7.6, 7.8, 7.8, 9.0])


def test_contended_backward_overlap_hand_timeline():
    # compute runs 2x slower while a collective is in flight. fwd 0-1, bwd from 1: b0 ready 2.0,
    # b0 2.0-3.2; by 3.2 backward did 1.0 + 1.2/2 = 1.6 of its 2.0 s: ready b1 at 3.6 = backward
    # end; b1 3.6-4.8; wait, apply 0.2 -> 5.0 (4.6 without contention)
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof), overlap="backward", iterations=3, compute_slowdown=2.0)
    assert res.iteration_times_s == pytest.approx([5.0, 5.0, 5.0])
    (bwd,) = _events(res.trace, 0, "backward", 0)
    assert (bwd.start_s, bwd.duration_s) == pytest.approx((1.0, 2.6))
    (ready,) = _events(res.trace, 1, "ready:b1", 0)
    assert ready.start_s == pytest.approx(3.6)
    assert res.meta["compute_slowdown"] == 2.0


def test_contended_forward_overlap_hand_timeline():
    # step 0 as above, step() returns at 3.6 with b1 3.6-4.8 in flight. step 1: wait for b1 until
    # 4.8, apply 0.1, 0.5 of forward (nothing in flight) -> 5.4, apply b0 0.1, 0.5 more -> 6.0;
    # bwd from 6.0: b0 7.0-8.2, b1 ready at 8.6; the period is 8.6 - 3.6 = 5.0 (4.6 without)
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof), overlap="forward", iterations=4, compute_slowdown=2.0)
    assert res.iteration_times_s == pytest.approx([3.6, 5.0, 5.0, 5.0])
    (fwd,) = _events(res.trace, 0, "forward", 1)
    assert (fwd.start_s, fwd.duration_s) == pytest.approx((3.6, 2.4))
    (comm,) = _events(res.trace, 0, "allreduce:b1c0", 1)
    assert (comm.start_s, comm.end_s) == pytest.approx((8.6, 9.8))


def test_compute_running_beside_a_forward_overlapped_transfer_is_slowed():
    # collectives of 0.5 s, b1 first: step 0 ends at 3.0 with b1 3.0-3.5 and b0 3.5-4.0 in flight.
    # step 1: wait for b1 until 3.5; apply b1 (0.1) beside b0's transfer at half speed -> 3.7;
    # 0.5 of forward: 0.15 by 4.0, 0.35 after -> 4.35; apply b0 -> 4.45; 0.5 more -> 4.95
    # (without contention: 3.5, 3.6, 4.1, 4.2, 4.7)
    prof = two_layer_profile()
    plan = two_bucket_plan(prof, order=((1, 0), (0, 0)))
    fast = ClusterSpec.uniform(2, 16000.0, 0.0)
    for f, end in ((1.0, 4.7), (2.0, 4.95)):
        res = simulate(prof, fast, plan, overlap="forward", iterations=3, compute_slowdown=f)
        (fwd,) = _events(res.trace, 0, "forward", 1)
        assert (fwd.start_s, fwd.end_s) == pytest.approx((3.0, end))
        (apply1,) = _events(res.trace, 0, "apply:b1", 1)
        assert apply1.duration_s == pytest.approx(0.1 * f)


@pytest.mark.parametrize("bad", [0.5, -1, "2", True])
def test_compute_slowdown_must_be_a_factor_of_at_least_one(bad):
    prof = two_layer_profile()
    with pytest.raises(CaramelError, match="compute_slowdown"):
        simulate(prof, slow_link_cluster(), two_bucket_plan(prof), compute_slowdown=bad)


def test_busy_advance_walks_collective_intervals():
    from caramel.sim.event_loop import Busy

    b = Busy(2.0)
    b.add(1.0, 2.0)
    b.add(3.0, 5.0)
    assert b.advance(0.0, 0.5) == pytest.approx(0.5)     # before any collective
    assert b.advance(0.0, 1.25) == pytest.approx(1.5)    # 1.0 free, 0.25 at half speed
    assert b.advance(0.0, 2.0) == pytest.approx(2.5)     # 1.0 free, 0.5 in the busy second, 0.5 free
    assert b.advance(2.5, 10.0) == pytest.approx(13.5)   # 0.5 free, 1.0 of work in 2 s, 8.5 after
    assert b.advance(6.0, 1.0) == pytest.approx(7.0)
    assert Busy(1.0).advance(1.5, 1.0) == 2.5


def test_no_overlap_hand_timeline():
    # everything issued at backward end (3.0): 3.0-4.2, 4.2-5.4, apply -> 5.6
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof), overlap="none", iterations=3)
    assert res.step_time_s == pytest.approx(5.6)
    assert res.exposed_comm_s == pytest.approx(2.4)
    issues = [e for e in res.trace.events if e.rank == 1 and e.kind == "issue" and e.iteration == 0]
    assert [e.start_s for e in issues] == pytest.approx([3.0, 3.0])


def test_issue_order_is_strict():
    # need-first order: b1 (ready 3.0) first, b0 waits behind it although ready at 2.0
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof, order=((1, 0), (0, 0))), overlap="forward")
    comm = {e.name: e for e in res.trace.events if e.rank == 0 and e.kind == "comm" and e.iteration == 0}
    assert (comm["allreduce:b1c0"].start_s, comm["allreduce:b1c0"].end_s) == pytest.approx((3.0, 4.2))
    assert (comm["allreduce:b0c0"].start_s, comm["allreduce:b0c0"].end_s) == pytest.approx((3.0, 5.4))
    # step 1: wait b1 3.0-4.2, apply, 0.5, wait b0 4.8-5.4, apply, 0.5 -> 6.0; bwd to 8.0
    assert res.iteration_times_s[1] == pytest.approx(5.0)


def test_slowest_worker_gates_collectives():
    # worker 1 at half speed: fwd 0-2, bwd 2-6, b0 ready 4, b1 ready 6: b0 4.0-5.2, b1 6.0-7.2;
    # worker 1 waits 6.0-7.2, applies 0.4 -> 7.6; every later step repeats with period 7.6
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(speeds=(1.0, 0.5)), two_bucket_plan(prof), overlap="backward")
    assert res.step_time_s == pytest.approx(7.6)
    assert res.compute_time_s == pytest.approx(6.4)
    comm0 = _events(res.trace, 0, "allreduce:b1c0", 0)[0]
    assert (comm0.start_s, comm0.end_s) == pytest.approx((3.0, 7.2))  # worker 0 issued at 3.0, saw it end at 7.2
    assert res.critical_path["speed"] == 0.5


def test_one_worker_is_pure_compute():
    prof = synthetic_profile(20)
    c = ClusterSpec.uniform(1, 1e9)
    for overlap in ("forward", "backward", "none"):
        res = simulate(prof, c, make_plan("fifo", prof, c), overlap=overlap)
        assert res.step_time_s == pytest.approx(prof.step_time_s)
        assert res.exposed_comm_s == pytest.approx(0.0, abs=1e-12)
        assert res.critical_path["bound"] == "compute"


def test_zero_compute_step_is_the_sum_of_collectives():
    prof = synthetic_profile(10, forward_time_s=0.0, backward_time_s=0.0, optimizer_time_s=0.0)
    c = ClusterSpec.uniform(4, 1e9, 1e-4)
    plan = make_plan("fifo", prof, c, bucket_cap_mb=0.05, first_bucket_mb=0.05)
    res = simulate(prof, c, plan, overlap="backward", comm="closed")
    want = sum(c.allreduce_time_s(plan.buckets[b].chunk_bytes(ch)) for b, ch in plan.order)
    assert res.step_time_s == pytest.approx(want, rel=1e-9)


def test_cluster_spec_round_trips_the_queued_latency(tmp_path):
    c = ClusterSpec.uniform(3, 5e8, 1e-3, queued_latency_s=2.5e-4)
    c.save(tmp_path / "c.json")
    back = ClusterSpec.load(tmp_path / "c.json")
    assert back.queued_latency_s == 2.5e-4 and back.effective_queued_latency_s == 2.5e-4
    old = c.to_dict()
    del old["queued_latency_s"]  # a file from before the field: queued collectives pay latency_s
    assert ClusterSpec.from_dict(old).effective_queued_latency_s == 1e-3


def test_cluster_spec_round_trips_the_collective_cpu(tmp_path):
    c = ClusterSpec.uniform(2, 5e8, 1e-3, collective_cpu_s=3.5e-4)
    c.save(tmp_path / "c.json")
    assert ClusterSpec.load(tmp_path / "c.json").collective_cpu_s == 3.5e-4
    old = c.to_dict()
    del old["collective_cpu_s"]  # a file from before the field: collectives cost compute nothing
    assert ClusterSpec.from_dict(old).collective_cpu_s == 0.0


def test_trace_round_trip(tmp_path):
    prof = two_layer_profile()
    res = simulate(prof, slow_link_cluster(), two_bucket_plan(prof))
    res.trace.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert back.to_dict() == res.trace.to_dict()
    # no partial overlap within a rank's wait lane
    waits = sorted((e for e in back.events if e.rank == 0 and e.lane == "wait"), key=lambda e: e.start_s)
    assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(waits, waits[1:]))


def test_large_cluster_traces_one_rank_per_speed():
    prof = synthetic_profile(30)
    c = ClusterSpec.uniform(100, 1e10)
    res = simulate(prof, c, make_plan("fifo", prof, c))
    assert {e.rank for e in res.trace.events} == {0}
    res = simulate(prof, c, make_plan("fifo", prof, c), trace_ranks=[3, 99])
    assert {e.rank for e in res.trace.events} == {3, 99}


def test_bad_inputs_name_the_field():
    prof = two_layer_profile()
    plan = two_bucket_plan(prof)
    c = slow_link_cluster()
    with pytest.raises(CaramelError, match="overlap"):
        simulate(prof, c, plan, overlap="sideways")
    with pytest.raises(CaramelError, match="iterations"):
        simulate(prof, c, plan, iterations=0)
    with pytest.raises(FormatError, match="bandwidth_bps"):
        ClusterSpec.uniform(2, -1e9)
    c.bandwidth_bps = -5.0  # mutated after construction: simulate re-validates
    with pytest.raises(FormatError, match="bandwidth_bps"):
        simulate(prof, c, plan)
    with pytest.raises(FormatError, match="topology"):
        ClusterSpec.uniform(2, 1e9, topology="hypercube")
    for bad in (-1e-3, float("nan"), "1ms", True):
        with pytest.raises(FormatError, match="queued_latency_s"):
            ClusterSpec.uniform(2, 1e9, queued_latency_s=bad)
        with pytest.raises(FormatError, match="collective_cpu_s"):
            ClusterSpec.uniform(2, 1e9, collective_cpu_s=bad)
    with pytest.raises(FormatError, match="collective_cpu_s"):
        ClusterSpec.uniform(2, 1e9, collective_cpu_s=None)
    other = synthetic_profile(3)
    with pytest.raises(MismatchError, match="plan"):
        simulate(other, slow_link_cluster(), plan)
    with pytest.raises(CaramelError, match="trace_ranks"):
        simulate(prof, slow_link_cluster(), plan, trace_ranks=[5])


def test_plan_bytes_must_match_the_profile():
    prof = two_layer_profile()
    plan = two_bucket_plan(prof)
    plan.buckets[0].bytes = 999
    with pytest.raises(MismatchError, match=r"buckets\[0\].bytes"):
        simulate(prof, slow_link_cluster(), plan)


def test_busy_charges_each_collective_cpu_to_the_compute_it_interrupts():
    from caramel.sim.event_loop import Busy

    b = Busy(1.0, cpu_s=0.25)
    b.add(1.0, 2.0)
    b.add(3.0, 5.0)
    assert b.advance(0.0, 0.5) == pytest.approx(0.5)     # done before the first collective
    assert b.advance(0.0, 1.5) == pytest.approx(1.75)    # paused 0.25 at 1.0
    assert b.advance(0.0, 3.5) == pytest.approx(4.0)     # paused at 1.0 and at 3.0
    assert b.advance(1.5, 1.0) == pytest.approx(2.5)     # began inside the first: already paid (or the core was free)
    assert b.advance(5.0, 1.0) == pytest.approx(6.0)     # after both
    # with a slowdown as well: the pause, then the rest of the collective at half speed
    b2 = Busy(2.0, cpu_s=0.5)
    b2.add(1.0, 3.0)
    assert b2.advance(0.0, 1.5) == pytest.approx(2.5)    # 1.0 free, paused to 1.5, 0.5 of work in 1.0
    assert b2.advance(0.0, 3.0) == pytest.approx(4.25)   # 1.0 free, pause, 0.75 in 1.5 s, 1.25 after 3.0
    # a pause that runs past the next collective's start still pays that one's too
    b3 = Busy(1.0, cpu_s=1.0)
    b3.add(1.0, 1.2)
    b3.add(1.5, 1.7)
    assert b3.advance(0.0, 2.0) == pytest.approx(4.0)    # 1.0 of work, pauses 1.0-2.0 and 2.0-3.0, 1.0 more


def test_collective_cpu_slows_the_compute_it_overlaps_hand_timeline():
    # the forward-overlap timeline of test_forward_overlap_hand_timeline, with 0.3 s of CPU per
    # collective: b0 starts at 2.0 while backward runs (1-3), so backward ends at 3.3 and b1,
    # ready then, goes 3.3-4.5 (b0 2.0-3.2 was done); step 1's forward (3.3) waits for b1 to 4.5,
    # no collective starts during it, ends at 4.5 + 0.1 + 0.5 + 0.1 + 0.5 = 5.7; backward 5.7,
    # b0 ready at 6.7 starts at once and pauses it: ends 8.0. Period 8.0 - 3.3 = 4.7.
    prof = two_layer_profile()
    cl = slow_link_cluster()
    cl.collective_cpu_s = 0.3
    res = simulate(prof, cl, two_bucket_plan(prof), overlap="forward", iterations=4)
    assert res.iteration_times_s == pytest.approx([3.3, 4.7, 4.7, 4.7])
    (bwd,) = _events(res.trace, 0, "backward", 1)
    assert (bwd.start_s, bwd.duration_s) == pytest.approx((5.7, 2.3))
    # blocked while a collective starts: nothing to pause (step 1's forward waits 3.3-4.5)
    (wait,) = _events(res.trace, 0, "wait:b1", 1)
    assert (wait.start_s, wait.duration_s) == pytest.approx((3.3, 1.2))
    assert res.meta["collective_cpu_s"] == 0.3


def test_a_compute_that_ends_where_a_collective_starts_never_pays_for_it():
    # the last bucket is ready when backward ends and its collective starts then: backward,
    # replayed after the collective is placed, must end at the same time, whatever the rounding
    import random

    from caramel.sim.event_loop import Busy

    rng = random.Random(0)
    for _ in range(2000):
        t, w = rng.uniform(0, 10), rng.uniform(0, 1)
        b = Busy(1.0, cpu_s=0.3)
        b.add(t + w, t + w + 1.0)
        assert b.advance(t, w) == t + w
