"""Which samples each rank reads, in which order: every sample once per epoch across ranks,
seeded, resumable mid-epoch, and, with `locality`, cached shards first.

`locality=False` is `torch.utils.data.DistributedSampler` with `drop_last=True`, index for
index: the epoch's seeded permutation, rank r taking every W-th sample. Each rank then touches
nearly every shard, so a per-rank cache must hold the whole data set to help.

`locality=True` gives rank r a home: the r-th contiguous run of N // W samples in shard order
(the last N mod W samples are left out, as DistributedSampler leaves out N mod W). Each epoch
the rank's home shards are shuffled (seeded by seed, epoch, rank), the ones its cache holds
now are moved to the front, and samples are shuffled within groups of `mix_shards` shards.
So a rank reads only ~1/W of the data, and a cache smaller than that still hits: the shards
read last in one epoch are the ones still cached, and they are read first in the next, before
the misses evict them. Across ranks the epoch's sample set is the same as DistributedSampler's
whenever W divides N (each sample exactly once); the price is that a rank's batches come from
its home, a stratified rather than global shuffle.

The state (`state_dict`) is the epoch, the samples yielded, and the epoch's shard order, which
depended on the cache when the epoch began, so a resumed run reads the same samples in the
same order whatever its cache holds.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from caramel.data.format import DatasetIndex
from caramel.errors import CaramelError


class LocalityAwareSampler(torch.utils.data.Sampler[int]):
    """Sample indices for one rank; `cached` returns the shard names its cache holds now."""

    def __init__(self, index: DatasetIndex, world_size: int, rank: int, seed: int = 0, locality: bool = True,
                 cached: Callable[[], set[str]] | None = None, mix_shards: int = 2):
        if not 0 <= rank < world_size:
            raise CaramelError(f"rank {rank} is not in a world of {world_size}")
        if index.num_samples < world_size:
            raise CaramelError(f"the data set has {index.num_samples} samples, fewer than the {world_size} ranks")
        if mix_shards < 1:
            raise CaramelError(f"mix_shards must be >= 1, got {mix_shards}")
        self.index, self.world_size, self.rank, self.seed = index, world_size, rank, seed
        self.locality, self.cached, self.mix_shards = locality, cached, mix_shards
        self.per_rank = index.num_samples // world_size
        self.epoch = 0
        self.yielded = 0
        self._shard_order: list[int] | None = None  # of the current epoch, once chosen
        self._resume: dict[str, Any] | None = None

    def __len__(self) -> int:
        return self.per_rank

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler.set_epoch: the next iteration is epoch `epoch` (from its start)."""
        if epoch != self.epoch:
            self.epoch, self.yielded, self._shard_order = epoch, 0, None

    def _home(self) -> tuple[int, int]:
        return self.rank * self.per_rank, (self.rank + 1) * self.per_rank

    def home_shards(self) -> list[int]:
        """The shards holding this rank's home samples (locality mode)."""
        lo, hi = self._home()
        return list(range(self.index.shard_of(lo), self.index.shard_of(hi - 1) + 1))

    def _generator(self, *salt: int) -> torch.Generator:
        g = torch.Generator()
        seed = self.seed
        for s in salt:
            seed = seed * 1_000_003 + s
        return g.manual_seed(seed % (2 ** 63))

    def choose_shard_order(self) -> list[int]:
        shards = self.home_shards()
        perm = torch.randperm(len(shards), generator=self._generator(self.epoch, self.rank, 1)).tolist()
        shuffled = [shards[i] for i in perm]
        held = self.cached() if self.cached is not None else set()
        first = [k for k in shuffled if self.index.shards[k].name in held]
        return first + [k for k in shuffled if self.index.shards[k].name not in held]

    def epoch_indices(self) -> list[int]:
        """This rank's whole order for the current epoch (the shard order chosen once per epoch)."""
        if not self.locality:
            # DistributedSampler(shuffle=True, drop_last=True), index for index
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.index.num_samples, generator=g).tolist()
            return order[: self.per_rank * self.world_size][self.rank::self.world_size]
        if self._shard_order is None:
            self._shard_order = self.choose_shard_order()
        lo, hi = self._home()
        out: list[int] = []
        for start in range(0, len(self._shard_order), self.mix_shards):
            group = self._shard_order[start:start + self.mix_shards]
            samples = [i for k in group for i in self.index.sample_range(k) if lo <= i < hi]
            perm = torch.randperm(len(samples), generator=self._generator(self.epoch, self.rank, 2, group[0])).tolist()
            out += [samples[i] for i in perm]
        return out

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_indices()
        start = self.yielded
        for i in order[start:]:
            self.yielded += 1
            yield i
        # an epoch read to its end moves on, as a loop calling set_epoch(epoch + 1) would
        self.epoch, self.yielded, self._shard_order = self.epoch + 1, 0, None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "yielded": self.yielded, "shard_order": self._shard_order,
                "seed": self.seed, "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "world_size", "rank"):
            if state.get(key) != getattr(self, key):
                raise CaramelError(f"sampler state is for {key}={state.get(key)!r}, this sampler has {getattr(self, key)!r}")
        self.epoch, self.yielded = int(state["epoch"]), int(state["yielded"])
        self._shard_order = list(state["shard_order"]) if state["shard_order"] is not None else None
