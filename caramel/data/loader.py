"""The distributed loader: a map-style dataset over a `Store` (with an optional `ShardCache`)
on torchdata's `StatefulDataLoader`, whose worker processes prefetch ahead of the step and
whose `state_dict()` (sampler position included) goes into checkpoints for exact resume.

With a cache a sample's whole shard is fetched once (one request), kept on local disk and
served from there; without one each sample is a range read from the store, as a plain
`Dataset` over remote files does. Each process also keeps the last few shards it used in
memory so consecutive samples of one shard cost one read.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from caramel.data.cache import ShardCache
from caramel.data.format import decode_sample
from caramel.data.sampler import LocalityAwareSampler
from caramel.data.store import Store
from caramel.errors import CaramelError

MEMORY_SHARDS = 2


class ShardedDataset(torch.utils.data.Dataset):
    """Samples of the dataset at `store`; shards through `cache` when one is given."""

    def __init__(self, store: Store, cache: ShardCache | None = None):
        self.store, self.cache = store, cache
        self.index = store.index()
        self._memory: OrderedDict[int, bytes] = OrderedDict()

    def __len__(self) -> int:
        return self.index.num_samples

    def _shard_bytes(self, k: int) -> bytes:
        if k in self._memory:
            self._memory.move_to_end(k)
            return self._memory[k]
        info = self.index.shards[k]
        data = self.cache.get(info)
        if data is None:
            with self.cache.fetching(info):
                data = self.cache.get(info, recheck=True)  # another worker may have fetched it while this one waited
                if data is None:
                    data = self.store.read_shard(info)
                    self.cache.put(info, data)
        self._memory[k] = data
        while len(self._memory) > MEMORY_SHARDS:
            self._memory.popitem(last=False)
        return data

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        k, pos = self.index.locate(int(i))
        info = self.index.shards[k]
        where = f"{self.store.url}/{info.name} sample {pos}"
        if self.cache is None:
            return decode_sample(self.store.read_sample_bytes(info, pos), where)
        data = self._shard_bytes(k)
        return decode_sample(data[info.offsets[pos]:info.offsets[pos + 1]], where)


@dataclass
class LoaderOptions:
    """How one rank loads: the batch, the prefetching workers, the cache and the sampler."""

    batch_size: int
    num_workers: int = 2
    prefetch_factor: int = 2
    cache_dir: str | None = None
    cache_budget_bytes: int = 0
    locality: bool = True
    seed: int = 0
    mix_shards: int = 2
    persistent_workers: bool = False  # keep worker processes across epochs (no start-up cost per epoch)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.num_workers < 0 or self.prefetch_factor < 1:
            raise CaramelError(f"loader: batch_size >= 1, num_workers >= 0, prefetch_factor >= 1 expected, got "
                               f"{self.batch_size}, {self.num_workers}, {self.prefetch_factor}")


def make_loader(url: str, rank: int, world_size: int, options: LoaderOptions):
    """A StatefulDataLoader over the dataset at `url` for one rank (the rank's cache in its own directory)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    store = Store(url)
    cache = None
    if options.cache_dir is not None:
        cache = ShardCache(os.path.join(options.cache_dir, f"rank{rank}"), options.cache_budget_bytes)
    dataset = ShardedDataset(store, cache)
    sampler = LocalityAwareSampler(dataset.index, world_size, rank, seed=options.seed, locality=options.locality,
                                   cached=cache.names if cache is not None else None, mix_shards=options.mix_shards)
    kwargs: dict[str, Any] = {}
    if options.num_workers > 0:
        kwargs.update(prefetch_factor=options.prefetch_factor, persistent_workers=options.persistent_workers,
                      multiprocessing_context="fork" if "fork" in torch.multiprocessing.get_all_start_methods() else None)
    return StatefulDataLoader(dataset, batch_size=options.batch_size, sampler=sampler, drop_last=True,
                              num_workers=options.num_workers, **kwargs)
