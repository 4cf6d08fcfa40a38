"""The I/O model's arithmetic: the link is shared, latency divides among workers, hits are free of the store."""
import pytest

from caramel.data.io_model import DataLoadModel, closed_loop
from caramel.errors import CaramelError


def test_terms():
    m = DataLoadModel(sample_bytes=1e4, batch_size=10, ranks=4, store_bandwidth_bps=1e8, store_latency_s=1e-3,
                      loader_workers=2)
    # 10 range reads per batch, 0.8 ms each on the link: 4 ranks x 8 ms = 32 ms of link per step; 8 workers
    # each reading for 10 ms between their 8 ms turns fill it (the closed loop's knee is at 18 / 8 < 8 workers)
    assert m.data_time_s() == pytest.approx(32e-3)
    half = DataLoadModel(**{**m.__dict__, "hit_rate": 0.5, "request_bytes": 5e4, "local_s_per_sample": 1e-4})
    # shard fetches keep the max + min / c charge: 5e4 remote bytes in one request: 16 ms + 0.5 ms / 8;
    # 10 local samples at 0.1 ms on one core
    assert half.data_time_s() == pytest.approx(16e-3 + 0.5e-3 / 8 + 1e-3)
    assert half.step_time_s(compute_s=0.03) == 0.03 and half.bottleneck(0.03) == "compute+comm"
    assert m.step_time_s(compute_s=0.01) == pytest.approx(m.data_time_s()) and m.bottleneck(0.01) == "data"
    serial = DataLoadModel(**{**m.__dict__, "loader_workers": 0})
    assert serial.step_time_s(0.01) == pytest.approx(0.01 + 32e-3)  # one reader per rank still fills the link
    busy = DataLoadModel(**{**m.__dict__, "request_overhead_s": 1e-3})
    # the store handles 4 ranks x 10 requests of 1 ms one after another: 40 ms, more than the link's 32
    assert busy.data_time_s() == pytest.approx(40e-3)
    for field in ("worker_request_s", "store_latency_s", "local_s_per_sample", "disk_s_per_read", "batch_overhead_s"):
        for bad in (-1e-3, float("nan"), float("inf")):
            with pytest.raises(CaramelError, match=field):
                DataLoadModel(**{**m.__dict__, field: bad})
    alone = DataLoadModel(**{**m.__dict__, "loader_workers": 1, "ranks": 1})
    assert alone.data_time_s() == pytest.approx(10e-3 + 8e-3)  # one request in flight: wait and transfer add up


def test_range_reads_are_a_closed_loop_of_the_workers():
    """Mean value analysis of k x ranks workers, each reading its batch one sample after another,
    over one FIFO link of fixed service: one worker is its serial sum, many fill the link, and
    between them each arrival waits for the queued requests and half the one in service."""
    one = DataLoadModel(sample_bytes=1e4, batch_size=10, ranks=1, store_bandwidth_bps=1e8, store_latency_s=1e-3,
                        loader_workers=1, worker_request_s=0.5e-3, local_s_per_sample=1e-4, batch_overhead_s=1e-3)
    # 10 x (1 ms latency + 0.5 ms read + 0.8 ms on the link) + 10 decodes of 0.1 ms + the 1 ms trip
    assert one.data_time_s() == pytest.approx(10 * 2.3e-3 + 2e-3)
    two = DataLoadModel(**{**one.__dict__, "loader_workers": 2, "cores_per_rank": 2.0})
    # by hand: think Z = 15 + 2 ms a batch, demand D = 8 ms; alone X1 = 1 / (Z + D), the link busy U1 = X1 D;
    # the second worker finds it busy U1 of the time and waits half a batch's service then: R2 = D (1 + U1 / 2)
    z, d = 17e-3, 8e-3
    u1 = d / (z + d)
    assert two.data_time_s() == pytest.approx((z + d * (1 + u1 / 2)) / 2)
    # the rank's local work runs on min(workers, cores): on one core the two workers' decodes and trips take turns
    one_core = DataLoadModel(**{**two.__dict__, "cores_per_rank": 1.0})
    z1 = 15e-3 + 2 * 2e-3
    assert one_core.data_time_s() == pytest.approx((z1 + d * (1 + d / (z1 + d) / 2)) / 2)
    # many workers: the link, 4 ranks x 8 ms, whatever the reads' time (up to the knee)
    many = DataLoadModel(**{**one.__dict__, "ranks": 4, "loader_workers": 16})
    assert many.data_time_s() == pytest.approx(32e-3)
    # the read under load lengthens each worker's sequence; its effect grows as the loop leaves the link
    steps = [DataLoadModel(**{**one.__dict__, "ranks": 2, "loader_workers": 2, "worker_request_s": r}).data_time_s()
             for r in (0.0, 1e-3, 2e-3, 4e-3, 8e-3)]
    assert steps == sorted(steps) and steps[0] >= 2 * 8e-3
    assert steps[-1] - steps[-2] == pytest.approx(4e-3 * 10 / 2, rel=0.05)  # far past the knee: 10 reads / 2 workers
    # never below the link, never above one worker's serial sum over the rank's workers plus the link
    for s in steps:
        assert 16e-3 - 1e-12 <= s


def test_a_capped_loop_carries_every_client_not_thinking_as_queued():
    """Past the link's limit the queue the next client meets is every batch not in think time
    (Little's law over the loop), not the throughput times the uncapped response."""
    one = closed_loop(1, think_s=17e-3, demand_s=8e-3)
    assert one.throughput_per_s == pytest.approx(1 / 25e-3) and one.queued == pytest.approx(8 / 25)
    for clients in (2, 3, 8):
        state = closed_loop(clients, think_s=2e-3, demand_s=8e-3)  # the link binds from the second client
        assert state.throughput_per_s == pytest.approx(1 / 8e-3)
        assert state.queued + state.throughput_per_s * 2e-3 == pytest.approx(clients)
        assert state.response_s == pytest.approx(clients * 8e-3 - 2e-3)
    # below the link nothing changes: response and queue are the mean value analysis's own
    below = closed_loop(2, think_s=17e-3, demand_s=8e-3)
    assert below.response_s == pytest.approx(8e-3 * (1 + 8 / 25 / 2))
    assert below.queued + below.throughput_per_s * 17e-3 == pytest.approx(2)
    with pytest.raises(CaramelError, match="closed loop"):
        closed_loop(0, 1e-3, 1e-3)


def test_a_measured_restart_adds_what_the_memory_batches_do_not_cover():
    """The epoch's start restarts warm workers: the measured start (`epoch_start_s`, from memory)
    adds beyond the k batches from memory the edge charges itself (their memory-tier work, not a
    mode's disk reads), once per epoch."""
    base = dict(sample_bytes=1e4, batch_size=10, ranks=2, store_bandwidth_bps=1e8, loader_workers=2,
                hit_rate=1.0, memory_hit_rate=1.0, local_s_per_sample=1e-5, batch_overhead_s=0.4e-3, epoch_steps=32)
    model = DataLoadModel(**base)
    from_memory_s = 10 * 1e-5 + 0.4e-3  # one batch from memory on one core
    assert model.epoch_edge_s(6e-3) == pytest.approx(2 * from_memory_s)  # compute-bound: k batches from memory
    started = DataLoadModel(**base, epoch_start_s=4e-3)
    assert started.restart_s() == pytest.approx(4e-3 - 2 * from_memory_s)
    assert started.epoch_edge_s(6e-3) == pytest.approx(4e-3)  # the measured start in place of the k batches
    assert started.step_time_s(6e-3) == pytest.approx(model.step_time_s(6e-3) + (4e-3 - 2 * from_memory_s) / 32)
    # with disk-tier hits only the memory tier's work is taken away: the calibration timed no disk read
    disk = dict(base, memory_hit_rate=0.5, disk_s_per_read=1e-3, samples_per_disk_read=1.0)
    assert DataLoadModel(**disk)._data_s(0.0) > from_memory_s + 4e-3  # 5 disk reads a batch
    assert DataLoadModel(**disk, epoch_start_s=4e-3).restart_s() == pytest.approx(4e-3 - 2 * from_memory_s)
    # a start no longer than the k batches adds nothing; data-bound, the restart adds to the compute sides
    assert DataLoadModel(**base, epoch_start_s=0.5e-3).epoch_edge_s(6e-3) == model.epoch_edge_s(6e-3)
    bound = dict(base, hit_rate=0.0, memory_hit_rate=0.0)
    assert DataLoadModel(**bound, epoch_start_s=4e-3).epoch_edge_s(6e-3) == pytest.approx(
        DataLoadModel(**bound).epoch_edge_s(6e-3) + 4e-3 - 2 * from_memory_s)
    for bad in (-1e-3, float("inf"), float("nan")):
        with pytest.raises(CaramelError, match="epoch_start_s"):
            DataLoadModel(**base, epoch_start_s=bad)


def test_the_bench_configurations_sit_either_side_of_the_knee():
    """The plain loader of the accuracy runs (docs/data.md): 2 ranks x 2 workers, 16 kB samples, a
    read under load of 1.5 ms. At 100 Mbit/s, batch 8, 2 ms latency, the loop keeps the 20.5 ms
    link nearly full; at 200 Mbit/s, batch 16, 1 ms, the same bytes but 8 reads per worker and step
    with a shorter turn each: the workers' sequences, not the link, set the step."""
    common = dict(sample_bytes=16047, ranks=2, loader_workers=2, worker_request_s=1.5e-3, local_s_per_sample=1e-5,
                  batch_overhead_s=1.3e-3, request_overhead_s=0.5e-3)
    at100 = DataLoadModel(batch_size=8, store_bandwidth_bps=100e6, store_latency_s=2e-3, **common)
    at200 = DataLoadModel(batch_size=16, store_bandwidth_bps=200e6, store_latency_s=1e-3, **common)
    link_s = 2 * 8 * 16047 * 8 / 100e6
    assert at100.data_time_s() < 1.15 * link_s  # near the link (20.5 ms; measured 21.7-22.8 ms)
    per_worker_s = 16 * (1e-3 + 1.5e-3 + 16047 * 8 / 200e6) / 2  # 8 reads per worker and step, serial
    assert at200.data_time_s() > per_worker_s > link_s  # beyond the knee: the sequences and their queueing


def test_an_epoch_that_starts_empty_pays_its_edge_once():
    base = dict(sample_bytes=1e4, batch_size=10, ranks=4, store_bandwidth_bps=1e8, store_latency_s=1e-3,
                loader_workers=2)
    free = DataLoadModel(**base)
    assert DataLoadModel(**base, epoch_steps=None) == free  # None: the model without the edge
    # data-bound (32 ms of link against 10 ms of compute): the last 2 batches' compute sides follow each other
    edged = DataLoadModel(**base, epoch_steps=16)
    assert edged.step_time_s(10e-3) == pytest.approx(32e-3 + 2 * 10e-3 / 16)
    assert edged.epoch_edge_s(10e-3) == pytest.approx(20e-3) and edged.data_time_s() == free.data_time_s()
    # compute-bound: the first batch waits for a whole worker's batch, 2 x 32 ms
    assert edged.step_time_s(50e-3) == pytest.approx(50e-3 + 2 * 32e-3 / 16)
    # a longer epoch spreads the same edge thinner; no workers, nothing prefetched, no edge
    assert DataLoadModel(**base, epoch_steps=160).step_time_s(10e-3) == pytest.approx(32e-3 + 20e-3 / 160)
    assert DataLoadModel(**{**base, "loader_workers": 0}, epoch_steps=16).epoch_edge_s(10e-3) == 0.0
    for bad in (0, -1, 1.5, True, "16"):
        with pytest.raises(CaramelError, match="epoch_steps"):
            DataLoadModel(**base, epoch_steps=bad)


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
    # an epoch starting empty, compute-bound at both ends (60 ms of compute): its first batch waits for a
    # worker's whole batch of the cached steps at its start (0 ms of link), not of the misses at its end
    start = DataLoadModel(**base, remote_steps_share=0.5, epoch_steps=16)
    first_s, last_s = start._data_s(0.0), start._data_s(start.remote_bytes_per_step() / 0.5)
    assert first_s < last_s < 60e-3
    assert start.step_time_s(compute_s=60e-3) == pytest.approx(60e-3 + 2 * first_s / 16)
    # data-bound at its end (the misses' 32 ms against 20 ms): the last 2 batches' compute sides, as before
    assert start.step_time_s(compute_s=20e-3) == pytest.approx(0.5 * 20e-3 + 0.5 * 32e-3 + 2 * 20e-3 / 16)
    for bad in (0.0, 1.5):
        with pytest.raises(CaramelError, match="remote_steps_share"):
            DataLoadModel(**base, remote_steps_share=bad)
