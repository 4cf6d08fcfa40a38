"""The memory tier keeps checked shards within its budget, least recently used out first, and
never holds a shard whose fetch or read failed; the tier counters see every sample served in
the loader's worker processes; small batches cross from workers by pipe, large ones by shared
memory, and both arrive as the same tensors."""
import pytest
import torch

from caramel.data.cache import ShardCache
from caramel.data.format import DataError, write_dataset
from caramel.data.loader import LoaderOptions, ShardedDataset, make_loader
from caramel.data.store import Store
from caramel.data.tiers import MemoryCache, TierCounters
from caramel.data.transport import PipedBatch, WorkerCollate, received
from caramel.errors import CaramelError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    write_dataset(root, ((torch.full((4,), float(i)), torch.tensor(i)) for i in range(48)), samples_per_shard=6)
    return root


def test_memory_cache_is_lru_within_its_budget():
    m = MemoryCache(budget_bytes=25)
    assert m.put("a", b"x" * 10) and m.put("b", b"y" * 10)
    assert m.get("a") == b"x" * 10  # a is now the most recent
    assert m.put("c", b"z" * 10)  # evicts b
    assert "b" not in m and "a" in m and "c" in m and m.used_bytes == 20 and m.evictions == 1
    assert not m.put("big", b"w" * 26) and "big" not in m and len(m) == 2
    with pytest.raises(CaramelError, match="memory cache budget"):
        MemoryCache(-1)


class _FailingStore(Store):
    """Hands back a shard cut short (as a connection dropped mid-body would) until told to stop."""

    fail = True

    def read_shard(self, info):
        data = super().read_shard(info)
        if _FailingStore.fail:
            from caramel.data.format import check_shard

            return check_shard(info, data[: len(data) // 2], "cut")  # raises DataError
        return data


def test_a_shard_that_failed_half_way_is_in_no_tier(dataset, tmp_path):
    counters = TierCounters()
    ds = ShardedDataset(_FailingStore(str(dataset)), ShardCache(tmp_path / "c", 1 << 20), MemoryCache(1 << 20), counters)
    with pytest.raises(DataError, match="truncated"):
        ds[0]
    assert len(ds.memory) == 0 and ds.cache.names() == set()
    _FailingStore.fail = False
    try:
        x, y = ds[0]
        assert int(y) == 0 and len(ds.memory) == 1 and ds.cache.names() == {"shard-00000.bin"}
        ds._current = None  # the next read of shard 0 goes to the tiers, not the shard in use
        ds[1]
        fresh = ShardedDataset(Store(str(dataset)), ShardCache(tmp_path / "c", 1 << 20), MemoryCache(0), counters)
        fresh[2]  # a new process: its memory is empty, the disk serves it
    finally:
        _FailingStore.fail = True
    s = counters.snapshot()
    assert (s.misses, s.memory_hits, s.disk_hits, s.store_requests, s.disk_reads) == (1, 1, 1, 1, 1)


def test_counters_see_the_workers_tiers(dataset, tmp_path):
    counters = TierCounters()
    opts = LoaderOptions(batch_size=4, num_workers=2, cache_dir=str(tmp_path), cache_budget_bytes=1 << 20,
                         memory_budget_bytes=1 << 20)
    loader = make_loader(str(dataset), 0, 2, opts, counters=counters)
    seen = []
    for epoch in range(2):
        before = counters.snapshot()
        seen.append(sorted(int(i) for _, y in loader for i in y))
        delta = counters.snapshot() - before
        assert delta.samples == 24
        if epoch == 0:  # each of the rank's 4 shards fetched once, by one of the workers
            assert delta.store_requests == 4 and delta.misses >= 6 and delta.disk_reads <= 4
        else:  # persistent workers keep their memory tiers: no store, at most a disk read per shard per worker
            assert delta.misses == 0 and delta.store_bytes == 0 and delta.disk_reads <= 8 and delta.hit_rate == 1.0
    assert seen[0] == seen[1] == list(range(24))


def test_pipe_and_shared_memory_batches_arrive_the_same():
    samples = [(torch.arange(5, dtype=torch.float32) + i, torch.tensor(i), {"w": torch.ones(2, dtype=torch.bfloat16)})
               for i in range(3)]

    class Info:  # collate as if in a loader worker
        pass

    import torch.utils.data._utils.worker as worker

    worker._worker_info = Info()
    try:
        piped = WorkerCollate(pipe_max_bytes=1 << 20)(samples)
        shared = WorkerCollate(pipe_max_bytes=0)(samples)
    finally:
        worker._worker_info = None
    assert isinstance(piped, PipedBatch) and not isinstance(shared, PipedBatch)
    assert shared[0].is_shared()
    a, b = received(piped), received(shared)
    reference = torch.utils.data.default_collate(samples)
    for x, y, z in ((a[0], b[0], reference[0]), (a[1], b[1], reference[1]), (a[2]["w"], b[2]["w"], reference[2]["w"])):
        assert isinstance(x, torch.Tensor) and torch.equal(x, z) and torch.equal(y, z) and x.dtype == z.dtype
