"""The I/O model's arithmetic: the link is shared, latency divides among workers, hits are free of the store."""
import pytest

from caramel.data.io_model import DataLoadModel
from caramel.errors import CaramelError


def test_terms():
    m = DataLoadModel(sample_bytes=1e4, batch_size=10, ranks=4, store_bandwidth_bps=1e8, store_latency_s=1e-3,
                      loader_workers=2)
    # 10 range reads: 10 ms latency over 2 workers, 4 ranks x 1e5 bytes over 1e8 bit/s = 32 ms;
    # 8 requests in flight: the waits hide behind the link's transfers but for 1/8 of them
    assert m.data_time_s() == pytest.approx(32e-3 + 5e-3 / 8)
    half = DataLoadModel(**{**m.__dict__, "hit_rate": 0.5, "request_bytes": 5e4, "local_s_per_sample": 1e-4})
    # 5e4 remote bytes in one request: 16 ms + 0.5 ms / 8; 10 local samples at 0.1 ms on one core
    assert half.data_time_s() == pytest.approx(16e-3 + 0.5e-3 / 8 + 1e-3)
    assert half.step_time_s(compute_s=0.03) == 0.03 and half.bottleneck(0.03) == "compute+comm"
    assert m.step_time_s(compute_s=0.01) == pytest.approx(m.data_time_s()) and m.bottleneck(0.01) == "data"
    serial = DataLoadModel(**{**m.__dict__, "loader_workers": 0})
    assert serial.step_time_s(0.01) == pytest.approx(0.01 + 32e-3 + 10e-3 / 4)  # the 4 ranks' requests overlap
    busy = DataLoadModel(**{**m.__dict__, "request_overhead_s": 1e-3})
    # the store handles 4 ranks x 10 requests of 1 ms one after another: 40 ms, more than the link's 32
    assert busy.data_time_s() == pytest.approx(40e-3 + 5e-3 / 8)
    slow = DataLoadModel(**{**m.__dict__, "worker_request_s": 1e-3})
    # each read also takes 1 ms of the cores in its worker's sequence: 10 x 2 ms over 2 workers, behind the link
    assert slow.data_time_s() == pytest.approx(32e-3 + 10e-3 / 8)
    for field in ("worker_request_s", "store_latency_s", "local_s_per_sample", "disk_s_per_read", "batch_overhead_s"):
        for bad in (-1e-3, float("nan"), float("inf")):
            with pytest.raises(CaramelError, match=field):
                DataLoadModel(**{**m.__dict__, field: bad})
    alone = DataLoadModel(**{**m.__dict__, "loader_workers": 1, "ranks": 1})
    assert alone.data_time_s() == pytest.approx(10e-3 + 8e-3)  # one request in flight: wait and transfer add up


def test_bad_input_is_named():
    with pytest.raises(CaramelError, match="hit_rate"):
        DataLoadModel(1, 1, 1, 1.0, hit_rate=1.5)


def test_cache_tiers():
    base = dict(sample_bytes=1e4, batch_size=10, ranks=2, store_bandwidth_bps=1e8, loader_workers=2,
                local_s_per_sample=1e-4, disk_s_per_read=2e-3, batch_overhead_s=1e-3)
    memory = DataLoadModel(**base, hit_rate=1.0, memory_hit_rate=1.0)
    assert memory.data_time_s() == pytest.approx(10 * 1e-4 + 1e-3)  # decode and the batch's trip, no disk
    disk = DataLoadModel(**base, hit_rate=1.0, memory_hit_rate=0.8)
    assert disk.data_time_s() == pytest.approx(memory.data_time_s() + 2 * 2e-3)  # 2 samples' shards from disk
    shared = DataLoadModel(**base, hit_rate=1.0, memory_hit_rate=0.8, samples_per_disk_read=2)
    assert shared.data_time_s() == pytest.approx(memory.data_time_s() + 2e-3)  # one read serves both
    assert memory.step_time_s(compute_s=5e-3) == pytest.approx(6e-3)  # the batch's trip is not prefetched
    with pytest.raises(CaramelError, match="memory_hit_rate"):
        DataLoadModel(**base, hit_rate=0.5, memory_hit_rate=0.6)


def test_contention_stretches_the_compute_side_only():
    base = dict(sample_bytes=1e4, batch_size=10, ranks=2, store_bandwidth_bps=1e8, loader_workers=2,
                local_s_per_sample=1e-4, batch_overhead_s=1e-3, hit_rate=1.0, memory_hit_rate=1.0)
    alone = DataLoadModel(**base)
    assert DataLoadModel(**base, contention=1.0) == alone  # 1 is the model without the term
    busy = DataLoadModel(**base, contention=1.5)
    # compute 5 ms + the batch's 1 ms receipt, 1.5x as long beside the busy workers; loading itself unchanged
    assert busy.step_time_s(compute_s=5e-3) == pytest.approx(9e-3) and alone.step_time_s(5e-3) == pytest.approx(6e-3)
    assert busy.data_time_s() == alone.data_time_s()
    # a data-bound step stays the data's: 4 ranks' misses over the link take 32 ms, more than 1.5 x 6 ms
    link = dict(base, hit_rate=0.0, memory_hit_rate=0.0, ranks=4)
    assert DataLoadModel(**link, contention=1.5).step_time_s(5e-3) == pytest.approx(DataLoadModel(**link).data_time_s())
    # the term can turn the bottleneck: 2 ms of decode against 1.6 ms of compute side, 2.4 ms stretched
    edge = dict(base, local_s_per_sample=2e-4, batch_overhead_s=0.0, loader_workers=1)
    assert DataLoadModel(**edge).bottleneck(1.6e-3) == "data"
    assert DataLoadModel(**edge, contention=1.5).bottleneck(1.6e-3) == "compute+comm"
    serial = dict(base, loader_workers=0)  # without workers nothing prefetches beside the step: data and compute add
    assert DataLoadModel(**serial, contention=1.5).step_time_s(5e-3) == DataLoadModel(**serial).step_time_s(5e-3)
    for bad in (0.9, float("nan")):
        with pytest.raises(CaramelError, match="contention must be >= 1"):
            DataLoadModel(**base, contention=bad)


def test_misses_read_last_cost_their_own_steps():
    # 4 ranks, half of each batch's bytes from the store: 16 ms of link per step spread evenly, under 20 ms of compute
    base = dict(sample_bytes=1e4, batch_size=10, ranks=4, store_bandwidth_bps=1e8, loader_workers=2, hit_rate=0.5,
                request_bytes=5e4)
    even = DataLoadModel(**base)
    assert even.step_time_s(compute_s=20e-3) == 20e-3
    assert DataLoadModel(**base, remote_steps_share=1.0) == even  # 1: the model without the term
    # the cached half of the epoch first: its steps fetch nothing (20 ms of compute), the other half
    # fetches the whole epoch's misses, 32 ms of link per step, which the compute no longer hides
    last = DataLoadModel(**base, remote_steps_share=0.5)
    assert last.step_time_s(compute_s=20e-3) == pytest.approx(0.5 * 20e-3 + 0.5 * 32e-3)
    assert last.data_time_s() == even.data_time_s()  # the epoch's loading is the same, only where it falls moves
    # with no compute to hide behind the split changes nothing: the same bytes cross the same link
    assert last.step_time_s(compute_s=0.0) == pytest.approx(even.step_time_s(compute_s=0.0)) == pytest.approx(16e-3)
    # a little compute: the cached steps cost it, 1 ms, while the evenly spread ones hid it behind the link
    assert last.step_time_s(compute_s=1e-3) == pytest.approx(0.5 * 1e-3 + 0.5 * 32e-3)
    # nothing remote: no step has misses to wait for, whatever the share
    cached = dict(base, hit_rate=1.0)
    assert DataLoadModel(**cached, remote_steps_share=0.1).step_time_s(5e-3) == DataLoadModel(**cached).step_time_s(5e-3)
    for bad in (0.0, 1.5):
        with pytest.raises(CaramelError, match="remote_steps_share"):
            DataLoadModel(**base, remote_steps_share=bad)
