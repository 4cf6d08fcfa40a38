"""The gossip simulator: compute-only on one worker, topology costs, algorithm=adam's overlap,
and Wang et al.'s comparison with all-reduce under a slow link and compute jitter."""
from __future__ import annotations

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
    fast = ClusterSpec.uniform(8, 1e11)  # communication hides in the forward: all alike, compute-bound
    assert sim("gossip:topology=complete", profile, fast).step_time_s == pytest.approx(profile.step_time_s, rel=0.02)
    # momentum sends twice the bytes
    assert sim("gossip:algorithm=momentum", profile, slow).step_time_s > ring


def test_adam_overlaps_backward_too(profile):
    cluster = ClusterSpec.uniform(4, 4e8)
    atc, cta = sim("gossip", profile, cluster), sim("gossip:algorithm=adam", profile, cluster)
    assert cta.step_time_s < atc.step_time_s
    assert cta.step_time_s >= profile.step_time_s - 1e-12


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
