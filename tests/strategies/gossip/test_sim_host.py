"""The gossip simulator's host and transport effects, each against what the earlier model did:
gloo's rendezvous (a send waits for its receiver's recv), concurrent peer flows below the
link's rate, compute slowed beside the overlapped trackers, trackers queued behind the
parameter messages on one link, and the bench's jitter emulated as a pause after the forward; then
the pieces each step is built of, on schedules small enough to compute by hand."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.sim.event_loop import Busy
from caramel.strategies.gossip.simulate import (TrackerLink, allreduce_step_s, job_step_median_s, run_compute,
                                                tracker_messages)
from caramel.topology.spec import ClusterSpec, WorkerSpec


def sim(spec: str, profile, cluster):
    return STRATEGIES.spec(spec).simulate(profile, cluster)


@pytest.fixture(scope="module")
def profile():
    # 8 x 300 kB = 2.4 MB, under the 4 MB default: one message
    return synthetic_profile(sizes_bytes=[300_000] * 8, forward_time_s=0.02, backward_time_s=0.04,
                             optimizer_time_s=0.002)


def model_bytes(profile) -> int:
    return sum(p.bytes for p in profile.trainable())


def test_a_send_waits_for_its_receivers_recv(profile):
    """2 workers, worker 1 at half speed, one message each way: the fast worker's message can
    start only once the slow one has posted its recv at its update, so the slow worker's step
    is the whole transfer plus its compute (the earlier model streamed it from the fast
    worker's update and averaged the two computes)."""
    cluster = ClusterSpec(workers=[WorkerSpec("w0", 1.0), WorkerSpec("w1", 0.5)], bandwidth_bps=1e8, latency_s=0.0)
    comm_s = model_bytes(profile) / (1e8 / 8)
    r = sim("gossip", profile, cluster)
    assert r.step_time_s == pytest.approx(comm_s + profile.step_time_s / 0.5, rel=1e-9)


def test_concurrent_peer_flows_run_at_the_probed_share_of_the_rate(profile):
    """The traffic probe's push_efficiency is the share n - 1 flows achieve; a ring worker's 2
    flows at n = 4 get halfway between it and 1 (0.8 for 0.6), one peer per step all of it."""
    base = dict(workers=4, bandwidth_bps=1e8, latency_s=0.0)
    plain, probed = ClusterSpec.uniform(**base), ClusterSpec.uniform(**base, meta={"push_efficiency": 0.6})
    two_peers_s = 2 * model_bytes(profile) / (1e8 / 8)
    ring, ring_probed = sim("gossip", profile, plain).step_time_s, sim("gossip", profile, probed).step_time_s
    assert ring_probed - ring == pytest.approx(two_peers_s / 0.8 - two_peers_s, rel=1e-9)
    one = "gossip:topology=one_peer_exponential"
    assert sim(one, profile, probed).step_time_s == pytest.approx(sim(one, profile, plain).step_time_s, rel=1e-12)
    with pytest.raises(CaramelError, match="push_efficiency"):
        sim("gossip", profile, ClusterSpec.uniform(**base, meta={"push_efficiency": 1.5}))


def test_backward_slows_only_while_the_overlapped_trackers_are_on_the_wire(profile):
    """A link too fast to wait on: the trackers are on the wire for ~0 s, so the compute
    slowdown changes nothing. At 1 Gbit/s a worker's 2.4 MB of trackers take 19.2 ms per peer
    flow, inside the rest of backward (35 ms after the first message is ready): backward grows
    by that span x (1 - 1 / slowdown), a ring at n = 4 sending to 2 peers twice the span."""
    spec = "gossip:algorithm=tracking,tracker_bucket_cap_mb=0.5"
    first_s = tracker_messages(profile.trainable(), len(profile.modules), 0.5 * 2 ** 20,
                               profile.backward_time_s)[0][0]
    assert 0 < first_s < profile.backward_time_s
    fast = dict(workers=4, bandwidth_bps=1e13, latency_s=0.0)
    plain = sim(spec, profile, ClusterSpec.uniform(**fast)).step_time_s
    slowed = sim(spec, profile, ClusterSpec.uniform(**fast, compute_slowdown=1.5)).step_time_s
    assert plain == pytest.approx(profile.step_time_s, rel=1e-3)
    assert slowed == pytest.approx(plain, rel=1e-4)
    wire_s = model_bytes(profile) / (1e9 / 8)  # float32: the trackers are the parameters' bytes
    assert wire_s < profile.backward_time_s - first_s
    for workers, flows in ((2, 1), (4, 2)):
        gbit = dict(workers=workers, bandwidth_bps=1e9, latency_s=0.0)
        plain = sim(spec, profile, ClusterSpec.uniform(**gbit)).step_time_s
        slowed = sim(spec, profile, ClusterSpec.uniform(**gbit, compute_slowdown=1.5)).step_time_s
        assert slowed - plain == pytest.approx(flows * wire_s * (1 - 1 / 1.5), rel=1e-6)


def test_trackers_queue_behind_the_parameter_messages_on_one_link():
    """A parameter no module uses travels last and no forward waits for it, so it is still on
    the wire through backward; the trackers leave behind it. Both exchanges go through each
    worker's link every step, so the step is at least both at the link's rate (the earlier
    model sent them side by side)."""
    prof = synthetic_profile(sizes_bytes=[100_000] * 6 + [2_000_000], forward_time_s=0.02, backward_time_s=0.04,
                             optimizer_time_s=0.002)
    params = [dataclasses.replace(p, first_use_order=None) if p.name == "layer6.weight" else p for p in prof.params]
    prof = dataclasses.replace(prof, params=params)
    rate = 1e8 / 8
    r = sim("gossip:algorithm=tracking,bucket_cap_mb=0.5,tracker_bucket_cap_mb=0.5", prof,
            ClusterSpec.uniform(2, 1e8, latency_s=0.0))
    assert r.step_time_s >= 2 * model_bytes(prof) / rate


def test_the_benchs_jitter_is_a_pause_after_the_forward(profile):
    """`pause_after_forward`: every worker sleeps to a nominal step of compute / (1 - f) and
    the jittered one to nominal x draw, so on a free link every step is padded by about the
    forward + backward at f = 0.5 (scaling compute by the draw alone keeps its mean); the
    pause does not slow beside transfers. An unknown key is an error."""
    free = dict(workers=4, bandwidth_bps=1e13, latency_s=0.0)
    pause = {"rank": 1, "fraction": 0.5, "seed": 0, "pause_after_forward": True}
    padded = sim("gossip", profile, ClusterSpec.uniform(**free, meta={"compute_jitter": pause}))
    fb_s = profile.forward_time_s + profile.backward_time_s
    assert padded.step_time_s >= profile.step_time_s + fb_s - 1e-9
    assert padded.meta["job_step_median_s"] >= profile.step_time_s + fb_s - 1e-9
    contended = sim("gossip", profile,
                    ClusterSpec.uniform(**free, compute_slowdown=2.0, meta={"compute_jitter": pause}))
    assert contended.step_time_s == pytest.approx(padded.step_time_s, rel=1e-3)
    # the all-reduce it is compared with waits for the pauses too: rank 0 (not jittered) sleeps
    # the forward + backward every step
    assert padded.meta["allreduce"]["step_time_s"] >= profile.step_time_s + fb_s - 1e-9


def test_the_pause_in_seconds_is_what_the_bench_sleeps(profile):
    """`pause_unit_s`: each worker's pause is (nominal x draw - 1) x it, the seconds the bench's
    schedule sleeps for the same seed, whatever the worker's speed (the profiled forward +
    backward at that speed is not what the bench's calibration measured)."""
    from caramel.bench.hetero import JitterSchedule
    from caramel.strategies.gossip.simulate import _jitter_and_pauses_s

    unit_s = 0.072
    cluster = ClusterSpec(workers=[WorkerSpec(f"w{i}", speed=s) for i, s in enumerate((1.3, 1.5, 1.3))],
                          bandwidth_bps=1e9, meta={"compute_jitter": {"rank": 1, "fraction": 0.5, "seed": 4,
                                                                      "pause_after_forward": True,
                                                                      "pause_unit_s": unit_s}})
    jit, pauses_s = _jitter_and_pauses_s(profile, cluster, 16)
    assert jit == [[1.0] * 16] * 3  # compute as profiled
    bench = JitterSchedule(0.5, 4)
    assert pauses_s[1] == pytest.approx([bench.sleep_factor() * unit_s for _ in range(16)])
    steady = JitterSchedule(0.5, 4, jittered=False)
    assert pauses_s[0] == pauses_s[2] == pytest.approx([steady.sleep_factor() * unit_s for _ in range(16)])


def test_a_pause_is_not_slowed_by_the_transfers():
    """The exchange is on the wire for the first 70 ms (compute at half speed): a 20 ms forward
    takes 40 ms, the 60 ms pause runs at its own length though the exchange ends inside it,
    then backward 40 ms uncontended."""
    busy = Busy(2.0)
    busy.add(0.0, 0.07)
    assert run_compute(busy, 0.0, [0.02], [0.0], 0.06, 0.04) == pytest.approx((0.10, 0.14, 0.0))
    # a forward waits for its bytes, and the wait is counted
    assert run_compute(Busy(2.0), 0.0, [0.01, 0.01], [0.0, 0.05], 0.0, 0.0) == pytest.approx((0.06, 0.06, 0.04))


def test_the_trackers_slow_backward_for_their_wire_time_only():
    """Backward of 40 ms, the first tracker message ready after 10 ms, the trackers 20 ms on
    the wire at slowdown 2: 10 ms of backward's compute is lost; on a free link nothing. Inside
    the parameter exchange's span (already slowed) they add nothing, past its end that part."""
    assert run_compute(Busy(2.0), 0.0, [], [], 0.0, 0.04, (0.01, 0.02, 0.0)) == pytest.approx((0.0, 0.05, 0.0))
    assert run_compute(Busy(2.0), 0.0, [], [], 0.0, 0.04, (0.01, 0.0, 0.0)) == pytest.approx((0.0, 0.04, 0.0))
    # queued behind parameter messages leaving the link at 35 ms: on the wire 35-55 ms, 5 ms of backward lost
    assert run_compute(Busy(2.0), 0.0, [], [], 0.0, 0.04, (0.01, 0.02, 0.035)) == pytest.approx((0.0, 0.045, 0.0))
    for exchange_end_s, end_s in ((0.05, 0.065), (0.03, 0.06)):  # trackers on the wire 20-40 ms
        busy = Busy(2.0)
        busy.add(0.0, exchange_end_s)
        assert run_compute(busy, 0.0, [], [], 0.0, 0.04, (0.01, 0.02, 0.0)) == pytest.approx((0.0, end_s, 0.0))


def test_trackers_land_behind_the_parameter_messages_and_the_receivers_recv():
    """1 kB of trackers at 1 us per byte, 1 ms latency. Without overlap: they leave once both
    workers are at their update and j's parameter messages have left its link. With: message
    by message, each once both backwards have made it ready, behind the parameter messages."""
    link = TrackerLink(0.001, 1000, [], 0.04)
    backward = [(1.0, 1.04), (1.0, 1.04)]
    assert link.landed_s(0, 1, 1e-6, [1.0, 1.0], [2.0, 0.0], backward) == pytest.approx(2.002)
    assert link.landed_s(0, 1, 1e-6, [1.0, 3.0], [2.0, 0.0], backward) == pytest.approx(3.003)
    over = TrackerLink(0.0, 1000, [(0.01, 1000)], 0.04)
    assert over.landed_s(0, 1, 1e-6, [0.0, 0.0], [1.5, 0.0], backward) == pytest.approx(1.501)
    assert over.landed_s(0, 1, 1e-6, [0.0, 0.0], [0.0, 0.0], [(1.0, 1.04), (1.2, 1.28)]) == pytest.approx(1.221)


def test_the_job_step_median_is_a_median_of_the_slowest_clock():
    """Per step the slowest worker's clock: 0, 2, 3, 5, 10; its advances 2, 1, 2, 5: median 2
    (mean 2.5)."""
    assert job_step_median_s([[0, 1, 3, 4, 10], [0, 2, 3, 5, 6]], 0) == 2
    assert job_step_median_s([[0, 1, 3, 4, 10], [0, 2, 3, 5, 6]], 2) == 3.5


def test_the_allreduce_waits_for_the_slowest_workers_pause(profile):
    """A free link: every step is the forward + backward plus the longer pause, then the update."""
    cluster = ClusterSpec.uniform(2, 1e13, latency_s=0.0)
    fb_s = profile.forward_time_s + profile.backward_time_s
    step_s = allreduce_step_s(profile, cluster, [1e12, 1e12], [[1.0] * 4] * 2, 8, [[0.1] * 4, [0.0] * 4])
    assert step_s == pytest.approx(fb_s + 0.1 + profile.optimizer_time_s)


@pytest.mark.parametrize("meta, match", [
    ({"push_efficiency": "fast"}, r"push_efficiency must be a number in \(0, 1\].*'fast'"),
    ({"push_efficiency": True}, "push_efficiency"),
    ({"compute_jitter": {"rank": 1.9, "fraction": 0.5}}, r"compute_jitter.rank must be an int in 0..3, got 1.9"),
    ({"compute_jitter": {"rank": True, "fraction": 0.5}}, "compute_jitter.rank"),
    ({"compute_jitter": {"rank": 4, "fraction": 0.5}}, "compute_jitter.rank"),
    ({"compute_jitter": {"rank": "2", "fraction": 0.5}}, "compute_jitter.rank"),
    ({"compute_jitter": {"rank": 1, "fraction": "0.5"}}, r"compute_jitter.fraction must be a number in \[0, 1\)"),
    ({"compute_jitter": {"rank": 1, "fraction": 1.0}}, "compute_jitter.fraction"),
    ({"compute_jitter": {"rank": 1, "fraction": 0.5, "seed": 2.7}}, "compute_jitter.seed must be an int"),
    ({"compute_jitter": {"rank": 1, "fraction": 0.5, "seed": False}}, "compute_jitter.seed"),
    ({"compute_jitter": {"rank": 1, "fraction": 0.5, "sed": 3}}, r"unknown key\(s\) 'sed'; expected rank, fraction"),
    ({"compute_jitter": {"rank": 1}}, "needs 'rank' and 'fraction'"),
    ({"compute_jitter": [1, 0.5]}, "compute_jitter must be a dict"),
    ({"compute_jitter": {"rank": 1, "fraction": 0.5, "pause_after_forward": True, "pause_unit_s": 0}},
     r"compute_jitter.pause_unit_s must be a finite number of seconds > 0"),
    ({"compute_jitter": {"rank": 1, "fraction": 0.5, "pause_after_forward": True, "pause_unit_s": "1"}},
     "pause_unit_s"),
    ({"compute_jitter": {"rank": 1, "fraction": 0.5, "pause_unit_s": 0.1}}, "pause_unit_s needs pause_after_forward"),
])
def test_bad_cluster_meta_is_one_clear_error(profile, meta, match):
    """Checked whatever the topology: one peer sends one flow, so push_efficiency is never used
    at n = 4 and 4 workers, yet a bad one is still an error."""
    with pytest.raises(CaramelError, match=match):
        sim("gossip:topology=one_peer_exponential", profile, ClusterSpec.uniform(4, 1e9, meta=meta))


def test_push_efficiency_is_checked_on_two_workers(profile):
    with pytest.raises(CaramelError, match="push_efficiency"):
        sim("gossip", profile, ClusterSpec.uniform(2, 1e9, meta={"push_efficiency": -3}))
