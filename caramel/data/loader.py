"""The distributed loader: a map-style dataset over a `Store` (with an optional `ShardCache`)
on torchdata's `StatefulDataLoader`, whose worker processes prefetch ahead of the step and
whose `state_dict()` (sampler position included) goes into checkpoints for exact resume.

With a cache a sample's whole shard is fetched once (one request), kept on local disk and
served from there; without one each sample is a range read from the store, as a plain
`Dataset` over remote files does. In front of the disk each loader worker keeps a memory tier
(`MemoryCache`, LRU within `memory_budget_bytes`), so a shard read again is neither read from
disk nor checked again; the shard in use is always kept, whatever the budget, so consecutive
samples of one shard cost one read. `TierCounters`, when given, count which tier served each
sample. Small batches cross from the workers as numpy arrays through the pipe (`transport`).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from caramel.data.cache import ShardCache
from caramel.data.format import DatasetIndex, decode_sample
from caramel.data.sampler import LocalityAwareSampler
from caramel.data.store import Store
from caramel.data.tiers import MemoryCache, TierCounters
from caramel.data.transport import PIPE_MAX_BYTES, WorkerCollate, received
from caramel.errors import CaramelError

MEMORY_BUDGET_BYTES = 64 << 20


class ShardedDataset(torch.utils.data.Dataset):
    """Samples of the dataset at `store`; shards through `memory`, then `cache`, when a cache is given."""

    def __init__(self, store: Store, cache: ShardCache | None = None, memory: MemoryCache | None = None,
                 counters: TierCounters | None = None):
        self.store, self.cache, self.counters = store, cache, counters
        self.memory = memory if memory is not None else MemoryCache(0)
        self.index = store.index()
        self._current: tuple[int, bytes, str] | None = None  # the shard in use (kept whatever the memory budget)

    def __len__(self) -> int:
        return self.index.num_samples

    def _shard_bytes(self, k: int) -> tuple[bytes, str, int, bool]:
        """The shard's bytes, the tier they came from, the store bytes fetched now and whether the disk was read now.
        Samples of the shard in use count for the tier that brought it: a shard fetched from the
        store makes all of its samples misses, not one miss and the rest memory hits."""
        if self._current is not None and self._current[0] == k:
            return self._current[1], self._current[2], 0, False
        info = self.index.shards[k]
        data, tier, fetched, disk_read = self.memory.get(info.name), "memory_hits", 0, False
        if data is None:
            data, tier, disk_read = self.cache.get(info), "disk_hits", True
        if data is None:
            with self.cache.fetching(info):
                data = self.cache.get(info, recheck=True)  # another worker may have fetched it while this one waited
                if data is None:
                    data, tier, disk_read = self.store.read_shard(info), "misses", False
                    fetched = len(data)
                    self.cache.put(info, data)
        if tier != "memory_hits":
            self.memory.put(info.name, data)  # whole and checked: the disk read and the fetch both check sha256
        self._current = (k, data, tier)
        return data, tier, fetched, disk_read

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        k, pos = self.index.locate(int(i))
        info = self.index.shards[k]
        where = f"{self.store.url}/{info.name} sample {pos}"
        if self.cache is None:
            data = self.store.read_sample_bytes(info, pos)
            if self.counters is not None:
                self.counters.add("misses", 1, len(data))
            return decode_sample(data, where)
        data, tier, fetched, disk_read = self._shard_bytes(k)
        if self.counters is not None:
            self.counters.add(tier, 1 if fetched else 0, fetched, int(disk_read))
        return decode_sample(data[info.offsets[pos]:info.offsets[pos + 1]], where)


@dataclass
class LoaderOptions:
    """How one rank loads: the batch, the prefetching workers, the cache and the sampler."""

    batch_size: int
    num_workers: int = 2
    prefetch_factor: int = 2
    cache_dir: str | None = None
    cache_budget_bytes: int = 0
    memory_budget_bytes: int = MEMORY_BUDGET_BYTES  # per loader worker process (each holds its own)
    locality: bool = True
    seed: int = 0
    mix_shards: int = 2
    # keep worker processes (and their memory tiers) across epochs, with no start-up cost per epoch
    persistent_workers: bool = True
    pipe_max_batch_bytes: int = PIPE_MAX_BYTES  # batches up to this size cross from workers by pipe, not shared memory

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.num_workers < 0 or self.prefetch_factor < 1:
            raise CaramelError(f"loader: batch_size >= 1, num_workers >= 0, prefetch_factor >= 1 expected, got "
                               f"{self.batch_size}, {self.num_workers}, {self.prefetch_factor}")
        if self.memory_budget_bytes < 0 or self.cache_budget_bytes < 0 or self.pipe_max_batch_bytes < 0:
            raise CaramelError(f"loader: memory_budget_bytes, cache_budget_bytes and pipe_max_batch_bytes must be >= 0, "
                               f"got {self.memory_budget_bytes}, {self.cache_budget_bytes}, {self.pipe_max_batch_bytes}")


@functools.lru_cache(maxsize=None)
def _stateful_loader_class():
    from torchdata.stateful_dataloader import StatefulDataLoader

    class ShardLoader(StatefulDataLoader):
        """StatefulDataLoader whose batches arrive from workers through the pipe when small (`transport`)."""

        def __iter__(self):
            return _Received(super().__iter__())

    return ShardLoader


class _Received:
    """The loader's iterator with each batch made tensors again (not a generator: the loader's
    own iterator, whose state `state_dict()` reads, is made when iteration starts)."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        return self

    def __next__(self):
        return received(next(self.inner))

    def __len__(self) -> int:
        return len(self.inner)


def make_loader(url: str, rank: int, world_size: int, options: LoaderOptions, counters: TierCounters | None = None,
                sampler: torch.utils.data.Sampler[int] | None = None, index: DatasetIndex | None = None):
    """A StatefulDataLoader over the dataset at `url` for one rank (the rank's cache in its own directory).
    `sampler`: an order of the caller's own (stateful, for resuming) instead of `LocalityAwareSampler`.
    `index`: the dataset's index when the caller has it, so the store is not asked for it again."""
    store = Store(url) if index is None else Store(url).with_index(index)
    cache = None
    if options.cache_dir is not None:
        cache = ShardCache(os.path.join(options.cache_dir, f"rank{rank}"), options.cache_budget_bytes)
    dataset = ShardedDataset(store, cache, MemoryCache(options.memory_budget_bytes if cache is not None else 0), counters)
    if sampler is None:
        sampler = LocalityAwareSampler(dataset.index, world_size, rank, seed=options.seed, locality=options.locality,
                                       cached=cache.names if cache is not None else None, mix_shards=options.mix_shards)
    kwargs: dict[str, Any] = {}
    if options.num_workers > 0:
        kwargs.update(prefetch_factor=options.prefetch_factor, persistent_workers=options.persistent_workers,
                      multiprocessing_context="fork" if "fork" in torch.multiprocessing.get_all_start_methods() else None,
                      collate_fn=WorkerCollate(options.pipe_max_batch_bytes))
    # its own generator: starting an epoch draws the workers' base seed from it, and drawing from
    # torch's global one would shift the training process's random stream (dropout) per epoch
    return _stateful_loader_class()(dataset, batch_size=options.batch_size, sampler=sampler, drop_last=True,
                                    num_workers=options.num_workers, generator=torch.Generator().manual_seed(options.seed),
                                    **kwargs)
