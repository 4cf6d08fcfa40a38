"""The link's queue with the arrivals' spread: the known closed forms at its limits, hand-computed."""
import math

import pytest

from caramel.data.io_model import DataLoadModel
from caramel.data.link_queue import arrival_scv, closed_loop, gg1_wait_s, think_scv
from caramel.errors import CaramelError


def test_pollaczek_khinchine_limits():
    """Poisson arrivals: service SCV 1 is M/M/1's rho S / (1 - rho), SCV 0 M/D/1's half of it;
    arrivals as regular as a fixed service (both SCVs 0) never wait below the limit."""
    lam, s = 50.0, 10e-3  # rho = 0.5
    assert gg1_wait_s(lam, s, 1.0, 1.0) == pytest.approx(0.5 * 10e-3 / 0.5)  # M/M/1: 10 ms
    assert gg1_wait_s(lam, s, 1.0, 0.0) == pytest.approx(5e-3)  # M/D/1: 5 ms
    assert gg1_wait_s(lam, s, 0.0, 0.0) == 0.0  # D/D/1
    assert gg1_wait_s(lam, s, 0.5, 0.0) == pytest.approx(2.5e-3)  # Allen-Cunneen: ca2 x M/D/1's
    assert gg1_wait_s(lam, s, 1.0, 2.0) == pytest.approx(15e-3)  # M/G/1, cs2 2: (1 + 2) / 2 x M/M/1's
    assert gg1_wait_s(100.0, s) == math.inf
    for bad in (dict(arrival_scv=-0.1), dict(service_scv=math.nan), dict(arrival_scv=math.inf)):
        with pytest.raises(CaramelError, match="squared coefficient of variation"):
            gg1_wait_s(lam, s, **bad)
    with pytest.raises(CaramelError, match="service time"):
        gg1_wait_s(lam, 0.0)


def test_the_loop_waits_the_arrivals_spread_times_the_fixed_service_wait():
    """Two clients, think Z, demand D: the second meets the first at the link U1 = D / (Z + D) of
    the time and waits half a service then, scaled by the arrivals' SCV: 1 is the loop as charged
    before spreads, 0 no wait at all (the loop's asymptotic bound)."""
    z, d = 17e-3, 8e-3
    u1 = d / (z + d)
    assert closed_loop(2, z, d, 1.0) == closed_loop(2, z, d)
    assert closed_loop(2, z, d).response_s == pytest.approx(d * (1 + u1 / 2))
    assert closed_loop(2, z, d, 0.25).response_s == pytest.approx(d * (1 + 0.25 * u1 / 2))
    none = closed_loop(2, z, d, 0.0)
    assert none.response_s == pytest.approx(d) and none.throughput_per_s == pytest.approx(2 / (z + d))
    # past the knee the link's limit binds whatever the spread
    for scv in (0.0, 0.3, 1.0):
        assert closed_loop(8, 2e-3, d, scv).throughput_per_s == pytest.approx(1 / d)
    with pytest.raises(CaramelError, match="arrival_scv"):
        closed_loop(2, z, d, -1.0)


# closed_loop's floats at 066e289, before the spread term: (clients, think_s, demand_s) ->
# (throughput_per_s, queued, response_s); each differed in the last bit under the first spread term
GOLDEN_066E289 = {
    (6, 0.03903968413078662, 0.008933943337017561): (106.57775200900721, 1.839238226199049, 0.017257243575972678),
    (4, 0.02947885684153327, 0.006099325675649754): (106.11308774146768, 0.8719074774562151, 0.008216776045387703),
    (11, 0.04517478866877838, 0.0016393830656201316): (232.9483041023994, 0.4766095914237874, 0.002045988672294774),
    (4, 0.033634414724447614, 0.011153817209946118): (78.42834991226921, 1.3621083528966427, 0.01736755082084873),
}


def test_without_spreads_the_loop_is_the_old_one_bit_for_bit():
    for (n, z, d), old in GOLDEN_066E289.items():
        for state in (closed_loop(n, z, d), closed_loop(n, z, d, 1.0)):
            assert (state.throughput_per_s, state.queued, state.response_s) == old


def test_many_clients_wait_as_allen_cunneen_says():
    """Many clients with a long think: the open queue. The fixed-service loop's wait is M/D/1's
    rho S / (2 (1 - rho)), and with the spread ca2 times it (Allen-Cunneen's G/D/1), not less: the
    spread scales the last arrival's wait, not the queues it meets (at rho 0.9, ca2 0.5, scaling
    inside the recursion gave a tenth of this)."""
    clients, d = 50_000, 1.0  # enough clients that the closed loop is the open queue to 2% at rho 0.95
    for rho, ca2 in ((0.9, 0.5), (0.9, 0.2), (0.95, 0.5), (0.5, 0.3)):
        think = clients / rho - d * (1 + rho / (2 * (1 - rho)))
        unscaled = closed_loop(clients, think, d)
        assert unscaled.response_s - d == pytest.approx(gg1_wait_s(unscaled.throughput_per_s, d, 1.0, 0.0), rel=0.02)
        state = closed_loop(clients, think, d, ca2)
        assert state.response_s - d == pytest.approx(ca2 * (unscaled.response_s - d), rel=1e-9)
        assert state.response_s - d == pytest.approx(gg1_wait_s(state.throughput_per_s, d, ca2, 0.0), rel=0.02)


def test_a_reads_think_time_scv():
    """Latency L fixed, a read of mean r and SCV c, the batch's local work w once in q reads:
    mean L + r + w / q, variance c r^2 + w^2 (1/q)(1 - 1/q)."""
    assert arrival_scv(2e-3, 1e-3, 0.0, 4, 0.0) == 0.0
    assert arrival_scv(2e-3, 1e-3, 1.0, 4, 0.0) == pytest.approx(1e-6 / 9e-6)
    assert arrival_scv(0.0, 1e-3, 0.5, 1, 0.0) == pytest.approx(0.5)  # no latency: the read's own SCV
    mean, var = 2e-3 + 1e-3 + 4e-3 / 4, 0.5e-6 + 16e-6 * 0.25 * 0.75
    assert arrival_scv(2e-3, 1e-3, 0.5, 4, 4e-3) == pytest.approx(var / mean ** 2)
    assert arrival_scv(0.0, 0.0, 0.7, 3, 0.0) == 1.0
    # reads more irregular than exponential think times: the loop's own queue, never more
    assert think_scv(0.0, 1e-3, 4.0, 1, 0.0) == pytest.approx(4.0) and arrival_scv(0.0, 1e-3, 4.0, 1, 0.0) == 1.0
    with pytest.raises(CaramelError, match="reads_per_batch"):
        arrival_scv(1e-3, 1e-3, 0.1, 0, 0.0)


def test_the_model_charges_the_spread_only_when_measured():
    """Without `worker_request_scv` the range reads' period is the one charged before (bit for bit);
    with it the queue shrinks toward the bound as the reads grow regular; shard fetches refuse it
    as they refuse the read time."""
    base = DataLoadModel(sample_bytes=16384, batch_size=8, ranks=2, store_bandwidth_bps=1e8, store_latency_s=3e-3,
                         loader_workers=2, worker_request_s=1.5e-3, local_s_per_sample=1e-5, batch_overhead_s=0.4e-3)
    assert base.worker_request_scv is None
    d = 16384 * 8 / 1e8 * 8  # a batch's 8 reads on the link
    k_local = (8 * 1e-5 + 0.4e-3) * 2  # the local work of the rank's share of its cores, per worker batch
    think = 8 * 4.5e-3 + k_local  # 4 workers x 10.5 ms of link each < think + 10.5 ms: below the knee
    assert base.data_time_s() == pytest.approx(2 / closed_loop(4, think, d).throughput_per_s, rel=1e-12)
    periods = [DataLoadModel(**{**base.__dict__, "worker_request_scv": c}).data_time_s() for c in (0.0, 1.0, 10.0)]
    ca2 = arrival_scv(3e-3, 1.5e-3, 0.0, 8, k_local)
    assert periods[0] == pytest.approx(2 / closed_loop(4, think, d, ca2).throughput_per_s)
    assert periods[0] < periods[1] <= periods[2] <= base.data_time_s()
    # a read SCV of 10 makes the think time's about 10 x 1.5^2 / 4.6^2 > 1: charged as without spreads
    assert periods[2] == base.data_time_s()
    with pytest.raises(CaramelError, match="worker_request_scv"):
        DataLoadModel(**{**base.__dict__, "worker_request_scv": -0.5})


def test_the_model_reports_the_arrival_scv_it_charges():
    """`link_arrival_scv` is the number the period uses: on the steps that fetch, whose reads are
    the epoch's remote bytes over `remote_steps_share` of its steps (8 here, not the 4 a step
    reads on average); None without a measured spread or for shard fetches."""
    base = DataLoadModel(sample_bytes=16384, batch_size=8, ranks=2, store_bandwidth_bps=1e8, store_latency_s=3e-3,
                         loader_workers=2, worker_request_s=1.5e-3, local_s_per_sample=1e-5, batch_overhead_s=0.4e-3,
                         hit_rate=0.5, remote_steps_share=0.5, worker_request_scv=0.3)
    k_local = (8 * 1e-5 + 0.4e-3) * 2
    assert base.link_arrival_scv() == arrival_scv(3e-3, 1.5e-3, 0.3, 8, k_local)
    assert base.link_arrival_scv(capped=False) == think_scv(3e-3, 1.5e-3, 0.3, 8, k_local)
    assert base.link_arrival_scv() != arrival_scv(3e-3, 1.5e-3, 0.3, 4, k_local)
    d, think = 16384 * 8 / 1e8 * 8, 8 * 4.5e-3 + k_local
    assert base._data_s(4 * 16384 / 0.5) == pytest.approx(
        2 / closed_loop(4, think, d, base.link_arrival_scv()).throughput_per_s, rel=1e-12)
    assert DataLoadModel(**{**base.__dict__, "worker_request_scv": None}).link_arrival_scv() is None
