"""The sampler reads every sample once per epoch across ranks (DistributedSampler's set), is
seeded and resumes exactly; with locality it reads cached shards first and a cache smaller than
a rank's share still hits; the StatefulDataLoader resumes mid-epoch to the same batches."""
import pytest
import torch

from caramel.data.cache import ShardCache
from caramel.data.format import write_dataset
from caramel.data.loader import LoaderOptions, ShardedDataset, make_loader
from caramel.data.sampler import LocalityAwareSampler
from caramel.data.store import Store

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    write_dataset(root, ((torch.full((3,), float(i)), torch.tensor(i)) for i in range(120)), samples_per_shard=10)
    return root


@pytest.mark.parametrize("locality", [False, True])
@pytest.mark.parametrize("world", [1, 3, 4])
def test_each_sample_once_per_epoch_across_ranks(dataset, locality, world):
    index = Store(str(dataset)).index()
    seen = []
    for rank in range(world):
        s = LocalityAwareSampler(index, world, rank, seed=7, locality=locality)
        s.set_epoch(3)
        seen.append(list(s))
        assert len(seen[-1]) == len(s) == 120 // world
    flat = [i for part in seen for i in part]
    assert sorted(flat) == list(range(120))  # 120 divisible by 1, 3, 4: every sample exactly once
    if not locality:  # index for index what torch's DistributedSampler gives
        for r in range(world):
            d = torch.utils.data.DistributedSampler(range(120), num_replicas=world, rank=r, seed=7, drop_last=True)
            d.set_epoch(3)
            assert seen[r] == list(d)


def test_seeded_epochs_differ_and_repeat(dataset):
    index = Store(str(dataset)).index()
    a, b = LocalityAwareSampler(index, 2, 1, seed=1), LocalityAwareSampler(index, 2, 1, seed=1)
    e0, e1 = list(a), list(a)  # a full pass moves to the next epoch
    assert e0 != e1 and sorted(e0) == sorted(e1) == list(range(60, 120))
    assert list(b) == e0 and list(b) == e1


def test_cached_shards_first_and_resume_keeps_the_order(dataset):
    index = Store(str(dataset)).index()
    held = {"shard-00003.bin", "shard-00005.bin"}
    s = LocalityAwareSampler(index, 2, 0, seed=3, cached=lambda: held, mix_shards=1)
    it = iter(s)
    first = [next(it) for _ in range(20)]
    assert {index.shard_of(i) for i in first} == {3, 5}
    state = s.state_dict()
    rest = list(it)
    # the resumed sampler's cache now holds other shards; the epoch's order must not change
    r = LocalityAwareSampler(index, 2, 0, seed=3, cached=lambda: {"shard-00000.bin"}, mix_shards=1)
    r.load_state_dict(state)
    assert list(r) == rest


def test_partial_cache_hits_with_locality_and_not_without(dataset, tmp_path):
    """A cache of 3 of a rank's 6 shards: locality reads cached shards first (3 hits per epoch
    after the first); a global shuffle over the LRU cache makes the shards it needs leave first."""
    store = Store(str(dataset))
    index = store.index()
    budget = 3 * max(s.nbytes for s in index.shards) + 10
    hits, fetched = {}, {}
    for locality in (True, False):
        cache = ShardCache(tmp_path / f"c{locality}", budget)
        ds = ShardedDataset(Store(str(dataset)), cache)
        s = LocalityAwareSampler(index, 2, 0, seed=0, locality=locality, cached=cache.names, mix_shards=1)
        for epoch in range(3):
            for i in s:
                ds[i]
        hits[locality], fetched[locality] = cache.stats.hit_rate, ds.store.stats.requests
    assert fetched[True] == 1 + 6 + 3 + 3  # the index, then epochs 2 and 3 read their 3 cached shards locally
    assert fetched[False] > 1 + 12 + 6 and hits[False] < hits[True]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_resumes_mid_epoch_exactly(dataset, tmp_path, workers):
    opts = LoaderOptions(batch_size=4, num_workers=workers, cache_dir=str(tmp_path), cache_budget_bytes=1 << 20, seed=5)
    ref = make_loader(str(dataset), 1, 2, opts)
    it = iter(ref)
    head = [next(it) for _ in range(4)]
    state = ref.state_dict()
    tail = list(it)
    resumed = make_loader(str(dataset), 1, 2, opts)
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(head) + len(tail) == 60 // 4 and len(again) == len(tail)
    for (x, y), (rx, ry) in zip(tail, again):
        assert torch.equal(y, ry) and torch.equal(x, rx)
    ys = torch.cat([b[1] for b in head + tail]).tolist()
    assert sorted(ys) == list(range(60, 120))
