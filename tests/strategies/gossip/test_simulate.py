"""The gossip simulator: compute-only on one worker, topology costs, algorithm=adam's overlap,
and Wang et al.'s comparison with all-reduce under a slow link and compute jitter."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.topology.spec import ClusterSpec


def sim(spec: str, profile, cluster):
    return STRATEGIES.spec(spec).simulate(profile, cluster)


@pytest.fixture(scope="module")
def profile():
    return synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                             backward_time_s=0.04, optimizer_time_s=0.002)


def test_one_worker_is_compute_only(profile):
    r = sim("gossip", profile, ClusterSpec.uniform(1, 1e9))
    assert r.step_time_s == pytest.approx(profile.step_time_s)
    assert r.wait_time_s == 0.0


def test_more_peers_cost_more_when_communication_bound(profile):
    slow = ClusterSpec.uniform(8, 2e8)
    ring, expo, one, full = (sim(f"gossip:topology={t}", profile, slow).step_time_s
                             for t in ("ring", "exponential", "one_peer_exponential", "complete"))
    assert one < ring < expo < full
    # communication cut into messages hides in the forward: all alike, compute-bound (as one
    # message the first module would wait for all of it)
    fast = ClusterSpec.uniform(8, 1e11)
    assert sim("gossip:topology=complete,bucket_cap_mb=0.5", profile, fast).step_time_s == pytest.approx(
        profile.step_time_s, rel=0.02)
    # momentum sends twice the bytes
    assert sim("gossip:algorithm=momentum", profile, slow).step_time_s > ring


def test_adam_overlaps_backward_too(profile):
    cluster = ClusterSpec.uniform(4, 4e8)
    atc, cta = sim("gossip", profile, cluster), sim("gossip:algorithm=adam", profile, cluster)
    assert cta.step_time_s < atc.step_time_s
    assert cta.step_time_s >= profile.step_time_s - 1e-12
    # overlap is the same exchange for any optimizer: the same bytes, the same time
    overlap = sim("gossip:algorithm=overlap", profile, cluster)
    assert overlap.step_time_s == cta.step_time_s
    assert overlap.meta["bytes_per_peer_per_step"] == atc.meta["bytes_per_peer_per_step"]


def test_gossip_beats_allreduce_under_jitter_and_a_slow_link(profile):
    base = dict(workers=4, bandwidth_bps=1e9)
    plain = sim("gossip", profile, ClusterSpec.uniform(**base))
    jitter = sim("gossip", profile, ClusterSpec.uniform(**base, meta={"compute_jitter": {"rank": 1, "fraction": 0.5, "seed": 3}}))
    # a synchronous step waits for the slowest draw; gossip's workers only for their neighbours' messages
    assert jitter.meta["allreduce"]["step_time_s"] > plain.meta["allreduce"]["step_time_s"] * 1.1
    assert jitter.meta["allreduce"]["gossip_speedup"] > plain.meta["allreduce"]["gossip_speedup"]
    link = ClusterSpec.uniform(**base, meta={"worker_bandwidth_bps": [1e9, 1e9, 2.5e8, 1e9]})
    slow_link = sim("gossip", profile, link)
    assert slow_link.meta["allreduce"]["step_time_s"] > plain.meta["allreduce"]["step_time_s"]
    with pytest.raises(CaramelError, match="worker_bandwidth_bps must list 4"):
        sim("gossip", profile, ClusterSpec.uniform(**base, meta={"worker_bandwidth_bps": [1e9]}))
    with pytest.raises(CaramelError, match="compute_jitter"):
        sim("gossip", profile, ClusterSpec.uniform(**base, meta={"compute_jitter": {"rank": 9, "fraction": 0.5}}))


def test_deprl_head_steps_send_once_per_cycle(profile):
    slow = ClusterSpec.uniform(4, 2e8)
    body = sim("gossip:personalize=layer11", profile, slow)
    tau = sim("gossip:personalize=layer11,head_steps=3", profile, slow)
    assert profile.step_time_s < tau.step_time_s < body.step_time_s
    # at most a quarter (one exposed exchange per cycle of 4, a chain of waits between neighbours
    # cut by the head steps), well above none
    share = (tau.step_time_s - profile.step_time_s) / (body.step_time_s - profile.step_time_s)
    assert 0.125 < share <= 0.25 * 1.01, share


def test_messages_are_cut_as_the_runtime_cuts_them():
    """`message_needs` against the runtime's own `make_buckets` on a real module: each module
    waits for the end of the last message holding one of its tensors."""
    import torch

    from caramel.profile.model_profile import ParamInfo
    from caramel.strategies.gossip.engine import make_buckets
    from caramel.strategies.gossip.simulate import message_needs

    sizes = [40, 100, 30, 70, 10]  # floats per layer
    layers = [torch.nn.Linear(1, s, bias=False) for s in sizes]
    tensors = [(f"l{k}", m.weight) for k, m in enumerate(layers)]
    owner = {id(m.weight): f"l{k}" for k, m in enumerate(layers)}
    order = [f"l{k}" for k in (0, 1, 2, 3)]  # l4 never ran: it goes last, and no forward waits for it
    cap = 150 * 4
    buckets = make_buckets(tensors, owner, order, cap)
    ends, sent = {}, 0
    for b in buckets:
        sent += b.nbytes
        for m in b.modules:
            ends[m] = sent
    params = [ParamInfo(index=k, name=f"l{k}.weight", shape=[s, 1], dtype="float32", numel=s, bytes=4 * s,
                        requires_grad=True, first_use_order=k if k < 4 else None) for k, s in enumerate(sizes)]
    need, total = message_needs(params, 5, 1, cap)
    assert total == sum(4 * s for s in sizes)
    assert need[:4] == [ends[f"l{k}"] for k in range(4)]
    assert need[:4] == [4 * 140, 4 * 140, 4 * 250, 4 * 250] and need[4] == 0
    need2, total2 = message_needs(params, 5, 2, cap)  # momentum: each layer's buffer beside it
    assert total2 == 2 * total and need2[0] == 4 * 80


def test_a_model_in_one_message_waits_for_all_of_it():
    """2 workers: with the model in one message (the runtime's 4 MB default above a 2.8 MB
    model) the first module waits for every byte, so nothing of the exchange hides behind the
    forward; smaller messages let the first modules start while the rest travels."""
    prof = synthetic_profile(sizes_bytes=[300_000] * 8, forward_time_s=0.02, backward_time_s=0.04,
                             optimizer_time_s=0.002)
    cluster = ClusterSpec.uniform(2, 1e8, latency_s=0.0)
    comm = sum(p.bytes for p in prof.trainable()) / (1e8 / 8)  # 192 ms: communication-bound
    whole = sim("gossip:bucket_cap_mb=4", prof, cluster)
    assert whole.step_time_s == pytest.approx(comm + prof.step_time_s, rel=1e-9)
    small = sim("gossip:bucket_cap_mb=0.3", prof, cluster)  # one layer per message
    assert small.step_time_s < whole.step_time_s - 0.015
    # the last layer's message lands, then the last layer's forward, backward and update
    last = prof.modules[-1].forward_time_s
    assert small.step_time_s == pytest.approx(comm + last + prof.backward_time_s + prof.optimizer_time_s, rel=1e-9)


def test_compute_beside_the_exchange_runs_at_the_clusters_slowdown():
    from caramel.strategies.gossip.options import GossipOptions
    from caramel.strategies.gossip.simulate import simulate_gossip

    profile = synthetic_profile(sizes_bytes=[1 << 20] * 8)  # 30 ms forward, 60 ms backward

    def step_ms(bandwidth_bps: float, f: float, cap_mb: float) -> float:
        cluster = ClusterSpec.uniform(2, bandwidth_bps, compute_slowdown=f)
        return simulate_gossip(profile, cluster, GossipOptions(bucket_cap_mb=cap_mb)).step_time_s * 1e3

    # small messages: the forward runs while later ones are on the wire, and slows
    assert step_ms(3e9, 1.5, 0.5) > step_ms(3e9, 1.0, 0.5) + 3.0
    # communication-bound: the forward waits for each message anyway, the slower compute hides in it
    assert step_ms(2e8, 1.5, 0.5) == pytest.approx(step_ms(2e8, 1.0, 0.5))


def test_tracking_sends_twice_the_bytes_and_waits_for_the_trackers_before_the_update(profile):
    """Uniform workers, trackers sent at step() (the reference path): nothing to hide them
    behind, so the step grows by exactly one exchange of the model's bytes to two peers (gloo's
    rendezvous: the data leaves once the receiver's recv notice has arrived)."""
    cluster = ClusterSpec.uniform(4, 1e9)
    dpsgd = sim("gossip", profile, cluster)
    tracking = sim("gossip:algorithm=tracking,overlap_trackers=false", profile, cluster)
    model_bytes = sum(p.bytes for p in profile.trainable())
    assert tracking.meta["bytes_per_peer_per_step"] == 2 * dpsgd.meta["bytes_per_peer_per_step"] == 2 * model_bytes
    # the receiver's recv notice, then the data; a ring worker's 2 peers share its link
    exchange_s = 2 * cluster.latency_s + model_bytes * 2 / (cluster.bandwidth_bps / 8)
    assert tracking.step_time_s == pytest.approx(dpsgd.step_time_s + exchange_s, rel=1e-9)
    # the moment buffers as well: a profile naming no optimizer is priced as SGD's one buffer,
    # one naming AdamW as its two
    assert sim("gossip:algorithm=tracking_momentum", profile, cluster).meta["bytes_per_peer_per_step"] == 3 * model_bytes
    adamw = dataclasses.replace(profile, meta={**profile.meta, "optimizer": "AdamW"})
    assert sim("gossip:algorithm=tracking_momentum", adamw, cluster).meta["bytes_per_peer_per_step"] == 4 * model_bytes
    # overlap_momentum: the parameters and AdamW's two moments, in the overlapped form
    om = sim("gossip:algorithm=overlap_momentum", adamw, cluster)
    assert om.meta["bytes_per_peer_per_step"] == 3 * model_bytes and om.overlap == "backward"


def test_overlapped_trackers_hide_behind_backward(profile):
    """overlap_trackers: each tracker message leaves once its gradients are ready, so the step is
    between dpsgd's and the reference path's; in one message (the cap above the model) it
    leaves at backward's end, as the reference's do."""
    cluster = ClusterSpec.uniform(4, 1e9)
    dpsgd = sim("gossip", profile, cluster).step_time_s
    at_step = sim("gossip:algorithm=tracking,overlap_trackers=false", profile, cluster).step_time_s
    overlapped = sim("gossip:algorithm=tracking,tracker_bucket_cap_mb=0.5", profile, cluster).step_time_s
    assert dpsgd < overlapped < at_step - 0.01
    one = sim("gossip:algorithm=tracking,tracker_bucket_cap_mb=100", profile, cluster).step_time_s
    assert one == pytest.approx(at_step, rel=1e-9)


def test_tracker_messages_are_cut_where_the_tracker_dtype_changes():
    """As the runtime's make_buckets cuts them: float64 and float32 trackers never share a message
    (a bf16 parameter's tracker is float32: no cut between it and a float32 one)."""
    from caramel.profile.model_profile import ParamInfo
    from caramel.strategies.gossip.simulate import tracker_messages

    dtypes = ["float32", "bfloat16", "float64", "float32"]
    params = [ParamInfo(index=k, name=f"l{k}.weight", shape=[4], dtype=d, numel=4, bytes=4 * 4, requires_grad=True,
                        ready_time_s=0.01 * (4 - k), first_use_order=k) for k, d in enumerate(dtypes)]
    # reverse forward order: l3 (f32), l2 (f64), l1 (bf16 -> f32), l0 (f32), one cap for all
    assert [nbytes for _, nbytes in tracker_messages(params, 4, 1e9, 0.05)] == [16, 32, 32]
