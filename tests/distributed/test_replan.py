"""replan="auto": the engine measures the link from its own collectives and re-plans when it
differs from what the plan assumed by more than 2x, on every rank at the same step."""
import pytest

from caramel.testing import run_workers
from tests.distributed.messy_workers import replan_worker


@pytest.mark.timeout(200)
def test_replan_auto_switches_together_and_stays_exact():
    results = run_workers(replan_worker, 2, args=(30,), timeout_s=180)
    r0, r1 = results
    assert r0["replans"], "the engine did not re-plan although the link is far faster than assumed"
    assert [(e["step"], e["plan"], e["measured_bps"]) for e in r0["replans"]] == \
           [(e["step"], e["plan"], e["measured_bps"]) for e in r1["replans"]]
    first = r0["replans"][0]
    assert first["assumed_bps"] == 1e13 and first["measured_bps"] < 0.5 * first["assumed_bps"]
    assert len({e["plan"] for e in r0["replans"]}) >= 1 and r0["replans"][0]["step"] % 5 == 0
    assert max(r0["diff"], r1["diff"]) <= 1e-5


@pytest.mark.timeout(120)
def test_online_plan_uses_the_measured_latencies():
    from tests.distributed.workers import measured_cluster_worker

    results = run_workers(measured_cluster_worker, 2, args=(6,), timeout_s=100)
    for res in results:
        assert not res["profiling"]
        # a tiny all-reduce over loopback costs tens of microseconds at least, never nothing
        assert res["latency_s"] is not None and 1e-6 < res["latency_s"] < 1.0, res
        assert res["plan_latency_s"] == res["latency_s"]
        # what each extra back-to-back piece added, per message of the 2 ring steps, within [0, latency]
        assert res["queued_extra_s"] is not None, res
        assert res["queued_latency_s"] == pytest.approx(min(max(res["queued_extra_s"] / 2, 0.0), res["latency_s"]))
        assert res["plan_queued_latency_s"] == res["queued_latency_s"]
        assert res["plan_bandwidth_bps"] > 0
        # 15 more collectives for the same bytes cost the process CPU time (the backend's
        # threads, the kernel's TCP work): more than nothing, far less than a second each; the
        # model computes on the CPU, so the plan is made for it
        assert 1e-7 < res["collective_cpu_s"] < 1.0, res
        # two ranks on this host's cores: shared only if it has one
        assert res["core_share"] == max(1.0, 2 / res["cores"]), res
        assert res["plan_collective_cpu_s"] == pytest.approx(res["collective_cpu_s"] * res["core_share"])
    assert results[0]["latency_s"] == results[1]["latency_s"], "the slowest rank's latency, agreed by all"
    assert results[0]["queued_latency_s"] == results[1]["queued_latency_s"]
    assert results[0]["collective_cpu_s"] == results[1]["collective_cpu_s"]


@pytest.mark.timeout(120)
def test_ranks_sharing_a_core_plan_for_their_cpu_time_times_the_share():
    from tests.distributed.workers import measured_cluster_worker

    results = run_workers(measured_cluster_worker, 2, args=(6, True, True), timeout_s=100)
    for res in results:
        # both ranks on core 0: each waits for the CPU time of both
        assert res["cores"] == 1 and res["core_share"] == 2.0, res
        assert 1e-7 < res["collective_cpu_s"] < 1.0, res
        assert res["plan_collective_cpu_s"] == pytest.approx(2 * res["collective_cpu_s"]), res
    assert results[0]["plan_collective_cpu_s"] == results[1]["plan_collective_cpu_s"]


@pytest.mark.timeout(120)
def test_without_the_queued_probe_the_cpu_per_collective_comes_from_the_lone_probes():
    from tests.distributed.workers import measured_cluster_worker

    results = run_workers(measured_cluster_worker, 2, args=(6, False), timeout_s=100)
    for res in results:
        assert res["queued_extra_s"] is None and res["queued_latency_s"] is None, res
        # the tiny probes' process CPU time each: more than nothing, far less than a second
        assert 1e-7 < res["collective_cpu_s"] < 1.0, res
        assert res["plan_collective_cpu_s"] == pytest.approx(res["collective_cpu_s"] * res["core_share"])
    assert results[0]["collective_cpu_s"] == results[1]["collective_cpu_s"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("broadcast_buffers", ["forward", True, False])
def test_online_profile_does_not_count_waiting_for_peers_as_compute(broadcast_buffers):
    from tests.distributed.workers import slow_peer_profile_worker

    delay_s = 0.3
    r0, _ = run_workers(slow_peer_profile_worker, 2, args=(delay_s, broadcast_buffers), timeout_s=100)
    assert not r0["profiling"]
    # rank 0 really waited for its peer in every profiled step: in the buffer broadcast at the
    # forward's start (DDP's timing, and the default's first forward), or else for the
    # gradients' collectives in step() (the default's later broadcasts went out as the forward
    # before ended, and are in by the next one) ...
    waited = [f + w for f, w in zip(r0["forward_s"], r0["waits_s"])]
    assert min(waited) > 0.5 * delay_s, r0
    if broadcast_buffers == "forward":
        assert min(r0["forward_s"]) > 0.5 * delay_s, r0
    elif broadcast_buffers:
        assert max(r0["forward_s"][1:]) < 0.25 * delay_s, r0
    # ... and its profile (a small CNN: milliseconds per phase) holds none of it
    assert r0["forward_time_s"] < 0.25 * delay_s and r0["optimizer_time_s"] < 0.25 * delay_s, r0
