"""The gossip simulator's host and transport effects, each against what the earlier model did:
gloo's rendezvous (a send waits for its receiver's recv), concurrent peer flows below the
link's rate, compute slowed beside the overlapped trackers, trackers queued behind the
parameter messages on one link, and the bench's jitter emulated as a pause after the forward."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.gossip.simulate import tracker_messages
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


def test_backward_slows_once_the_overlapped_trackers_are_on_the_wire(profile):
    """A link too fast to wait on: the trackers' exchange costs no time, but from its first
    message's leaving the rest of backward runs at the cluster's compute slowdown."""
    spec = "gossip:algorithm=tracking,tracker_bucket_cap_mb=0.5"
    fast = dict(workers=4, bandwidth_bps=1e13, latency_s=0.0)
    plain = sim(spec, profile, ClusterSpec.uniform(**fast)).step_time_s
    slowed = sim(spec, profile, ClusterSpec.uniform(**fast, compute_slowdown=1.5)).step_time_s
    first_s = tracker_messages(profile.trainable(), len(profile.modules), 0.5 * 2 ** 20, profile.backward_time_s)[0][0]
    assert 0 < first_s < profile.backward_time_s
    assert plain == pytest.approx(profile.step_time_s, rel=1e-3)
    assert slowed == pytest.approx(profile.step_time_s + 0.5 * (profile.backward_time_s - first_s), rel=1e-3)


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
    contended = sim("gossip", profile, ClusterSpec.uniform(**free, compute_slowdown=2.0, meta={"compute_jitter": pause}))
    assert contended.step_time_s == pytest.approx(padded.step_time_s, rel=1e-3)
    with pytest.raises(CaramelError, match="compute_jitter"):
        sim("gossip", profile, ClusterSpec.uniform(**free, meta={"compute_jitter": {**pause, "pause": True}}))
