"""The sample format round-trips, writes atomically, and is read back through local and http
stores; the shard cache evicts least recently used shards and never returns a damaged entry."""
import os

import pytest
import torch

from caramel.data.cache import ShardCache
from caramel.data.format import INDEX_NAME, DataError, DatasetIndex, decode_sample, write_dataset
from caramel.data.serve import serve_directory
from caramel.data.store import Store
from caramel.errors import CaramelError, FormatError

torch.set_num_threads(1)


def _samples(n):
    return [(torch.arange(6, dtype=torch.float32) + i, torch.tensor(i)) for i in range(n)]


def _decode_all(store):
    index = store.index()
    out = []
    for k, info in enumerate(index.shards):
        data = store.read_shard(info)
        out += [decode_sample(data[info.offsets[p]:info.offsets[p + 1]], "t") for p in range(info.num_samples)]
    return out


@pytest.mark.parametrize("via", ["path", "file", "http"])
def test_round_trip(tmp_path, via):
    samples = _samples(23)
    index = write_dataset(tmp_path / "ds", samples, samples_per_shard=5)
    assert [s.num_samples for s in index.shards] == [5, 5, 5, 5, 3]
    assert index.locate(12) == (2, 2)
    if via == "http":
        with serve_directory(tmp_path / "ds") as server:
            store = Store(server.url)
            got = _decode_all(store)
            one = decode_sample(store.read_sample_bytes(index.shards[2], 2), "t")
            assert server.requests_served == 1 + 5 + 1
    else:
        store = Store(str(tmp_path / "ds") if via == "path" else f"file://{tmp_path / 'ds'}")
        got = _decode_all(store)
        one = decode_sample(store.read_sample_bytes(index.shards[2], 2), "t")
    assert len(got) == 23
    for (x, y), (gx, gy) in zip(samples, got):
        assert torch.equal(x, gx) and torch.equal(y, gy)
    assert torch.equal(one[0], samples[12][0])
    assert store.stats.bytes_fetched == index.nbytes + (index.shards[2].offsets[3] - index.shards[2].offsets[2]) + \
        len((tmp_path / "ds" / INDEX_NAME).read_bytes())


def test_failed_write_leaves_no_index_and_no_partial_files(tmp_path):
    def samples():
        yield from _samples(7)
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError):
        write_dataset(tmp_path / "ds", samples(), samples_per_shard=3)
    names = sorted(os.listdir(tmp_path / "ds"))
    assert INDEX_NAME not in names
    assert not [n for n in names if n.endswith(".tmp")]
    assert names == ["shard-00000.bin", "shard-00001.bin"]  # whole shards only; unreadable without an index
    with pytest.raises(CaramelError, match="index.json is not there"):
        Store(str(tmp_path / "ds")).index()


def test_corrupt_shard_and_bad_index_are_named(tmp_path):
    write_dataset(tmp_path / "ds", _samples(4), samples_per_shard=2)
    shard = tmp_path / "ds" / "shard-00001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    store = Store(str(tmp_path / "ds"))
    with pytest.raises(DataError, match="shard-00001.bin.*corrupt"):
        store.read_shard(store.index().shards[1])
    with pytest.raises(DataError, match="corrupt sample"):
        decode_sample(b"not a tensor file", "x/shard-00001.bin sample 0")
    (tmp_path / "ds" / INDEX_NAME).write_text('{"format": "caramel.plan/1"}')
    with pytest.raises(FormatError, match="caramel.dataset/1"):
        Store(str(tmp_path / "ds")).index()


def test_unreachable_url_is_named():
    with serve_directory(os.getcwd()) as server:
        url = server.url
    with pytest.raises(CaramelError, match=f"data store '{url}/nowhere'"):
        Store(url + "/nowhere").index()


def test_cache_evicts_least_recently_used_and_drops_damaged_entries(tmp_path):
    index = write_dataset(tmp_path / "ds", _samples(8), samples_per_shard=2)
    store = Store(str(tmp_path / "ds"))
    shards = index.shards
    size = max(s.nbytes for s in shards)
    cache = ShardCache(tmp_path / "cache", budget_bytes=2 * size + size // 2)  # room for two shards
    for info in shards[:2]:
        assert cache.get(info) is None
        assert cache.put(info, store.read_shard(info))
    os.utime(tmp_path / "cache" / shards[0].name, ns=(1, 1))  # shard 0 least recent ...
    os.utime(tmp_path / "cache" / shards[1].name, ns=(2, 2))
    assert cache.get(shards[0]) is not None  # ... until this hit makes shard 1 the least recent
    cache.put(shards[2], store.read_shard(shards[2]))
    assert cache.names() == {shards[0].name, shards[2].name}
    assert cache.used_bytes() <= cache.budget_bytes and cache.stats.evictions == 1
    # a damaged entry (e.g. a crash mid-copy by another tool) is a miss, removed, never returned
    (tmp_path / "cache" / shards[2].name).write_bytes(b"half")
    assert cache.get(shards[2]) is None
    assert shards[2].name not in cache.names()
    assert cache.stats.hits == 1 and cache.stats.misses == 3


def test_cache_directory_without_space_is_an_error(tmp_path):
    with pytest.raises(CaramelError, match=f"cache directory '{tmp_path}'.*bytes free"):
        ShardCache(tmp_path, budget_bytes=1 << 62)


def test_index_parse_rejects_offsets_that_do_not_cover_the_shard(tmp_path):
    index = write_dataset(tmp_path / "ds", _samples(2), samples_per_shard=2)
    d = index.to_dict()
    d["shards"][0]["offsets"][-1] += 1
    with pytest.raises(FormatError, match="offsets"):
        DatasetIndex.from_dict(d, "idx")


def test_an_entry_another_worker_evicts_right_after_its_write_is_no_error(tmp_path, monkeypatch):
    """Loader workers share the cache: another's eviction may remove a shard between this
    worker's rename and its recency stamp; that is the shard evicted, not a failed write."""
    import caramel.data.cache as cache_module
    index = write_dataset(tmp_path / "ds", _samples(4), samples_per_shard=2)
    info = index.shards[0]
    cache = ShardCache(tmp_path / "cache", budget_bytes=1 << 20)
    write = cache_module.atomic_write_bytes

    def write_then_evicted(path, data):
        write(path, data)
        os.unlink(path)  # the other worker's eviction

    monkeypatch.setattr(cache_module, "atomic_write_bytes", write_then_evicted)
    assert cache.put(info, Store(str(tmp_path / "ds")).read_shard(info))
    assert cache.get(info) is None  # evicted: a miss, never a half entry


def test_a_miss_never_removes_the_copy_another_worker_writes_right_after_it(tmp_path, monkeypatch):
    """Loader workers share the cache: a shard absent when one worker looks may be renamed into
    place by another a moment later; the miss must not remove that fresh copy, or the worker
    waiting for the fetch lock finds nothing and fetches the shard from the store again."""
    import pathlib

    import caramel.data.cache as cache_module
    index = write_dataset(tmp_path / "ds", _samples(4), samples_per_shard=2)
    info = index.shards[0]
    data = Store(str(tmp_path / "ds")).read_shard(info)
    cache = ShardCache(tmp_path / "cache", budget_bytes=1 << 20)
    target = tmp_path / "cache" / info.name
    real_stat, real_read = os.stat, pathlib.Path.read_bytes
    landed = []

    def absent_then_written(path):  # the look finds nothing; the other worker's rename lands next
        landed.append(path)
        cache_module.atomic_write_bytes(target, data)
        raise FileNotFoundError(str(path))

    def first_look(path):
        return not landed and os.fspath(path) == str(target)

    monkeypatch.setattr(os, "stat", lambda p, *a, **k: absent_then_written(p) if first_look(p) else real_stat(p, *a, **k))
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda p: absent_then_written(p) if first_look(p) else real_read(p))
    assert cache.get(info) is None  # this look missed ...
    monkeypatch.undo()
    assert cache.get(info, recheck=True) == data  # ... and the copy written meanwhile is still there
    assert cache.stats.misses == 1 and cache.stats.hits == 1


def test_eviction_spares_an_entry_another_worker_fetches_or_read_since_the_listing(tmp_path, monkeypatch):
    """put() lists the entries, then evicts the least recent; by then another worker may hold a
    shard's fetch lock (writing a fresh copy) or have read it (no longer the least recent)."""
    import fcntl
    index = write_dataset(tmp_path / "ds", _samples(8), samples_per_shard=2)
    store = Store(str(tmp_path / "ds"))
    shards = index.shards
    size = max(s.nbytes for s in shards)
    cache = ShardCache(tmp_path / "cache", budget_bytes=2 * size + size // 2)  # room for two shards
    for k, info in enumerate(shards[:2]):
        cache.put(info, store.read_shard(info))
        os.utime(tmp_path / "cache" / info.name, ns=(k + 1, k + 1))  # shard 0 the least recent
    with open(tmp_path / "cache" / f".{shards[0].name}.lock", "a+") as held:  # another worker fetches shard 0
        fcntl.flock(held, fcntl.LOCK_EX)
        cache.put(shards[2], store.read_shard(shards[2]))
    assert cache.names() == {shards[0].name, shards[2].name}  # shard 1 went instead
    # a listing taken before shard 0 was read: its recency stamp has moved since, so it stays
    os.utime(tmp_path / "cache" / shards[2].name, ns=(10, 10))
    os.utime(tmp_path / "cache" / shards[0].name, ns=(20, 20))
    stale = [(n, s, 5 if n == shards[0].name else m) for n, s, m in cache._entries()]
    monkeypatch.setattr(cache, "_entries", lambda: stale)
    cache.put(shards[3], store.read_shard(shards[3]))
    monkeypatch.undo()
    assert cache.names() == {shards[0].name, shards[3].name}  # shard 2, least recent now, went instead
    assert cache.stats.evictions == 2
