"""`caramel train --data URL`: the training batches come from a data store through
`caramel.data`'s loader (shard cache on local disk, loader worker processes, locality sampler)
instead of the workload's in-memory training set.

A store is what `caramel data make DIR --workload NAME` writes: the workload's training split,
one sample per (input, target) pair, in `caramel.data`'s sharded format. Before any worker
starts, `check_store` reads the store's index and first sample and compares its tensors with
what the workload's model takes (`expected_sample`): a random store, a store of another
workload or another `--seq-len` is one CaramelError naming both; so is a store of another
split (its sample count differs from the workload's training split under this run's
--val-fraction, --text-bytes, --seq-len): its indices would run past the training set, or its
samples include what this run validates on. Validation keeps reading the workload's built-in
validation set (the store holds the training split only).

Two orders (`--data-order`):
- `locality` (default): `caramel.data`'s `LocalityAwareSampler`: rank r reads its home (the
  r-th 1/W of the samples in shard order), cached shards first. Each epoch still reads every
  sample at most once across ranks, but the batches are not those of the in-memory run: a
  rank's batch comes from its home, a stratified rather than a global shuffle (docs/data.md).
- `global`: `GlobalOrderSampler`, the training loop's own order (`ShardedSampler`): the very
  batches the in-memory run trains on, so the same parameters bit for bit, with every rank
  reading most shards (the cache must hold the whole set to help).

A fresh run (no checkpoint resumed) empties its rank's default cache (OUT_DIR/data-cache) first,
so the same command and seed give the same batches run after run; a given --cache-dir is kept.
Resuming is exact: the loader's `state_dict()` (sampler epoch, position and the epoch's shard
order, which depended on the cache when the epoch began) goes into the checkpoint per rank.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch

from caramel.data.format import decode_sample, write_dataset
from caramel.data.loader import LoaderOptions, make_loader
from caramel.data.store import Store
from caramel.errors import CaramelError
from caramel.train.config import TrainConfig
from caramel.train.data import ShardedSampler

MIB = 1 << 20


def expected_sample(cfg: TrainConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of each tensor of one stored sample that the workload's model takes."""
    name = cfg.run.workload
    if name == "digits":
        return [("float32", (1, 8, 8)), ("int64", ())]
    if name == "char_gpt":
        return [("int64", (cfg.data.seq_len,)), ("int64", (cfg.data.seq_len,))]
    raise CaramelError(f"--data: workload {name} cannot train from a store (ddrl fits its features on the whole "
                       f"training set in memory before training); use --workload digits or char_gpt, or drop --data")


def _describe(spec: list[tuple[str, tuple[int, ...]]]) -> str:
    return "(" + ", ".join(f"{d}[{', '.join(map(str, s))}]" for d, s in spec) + ")"


def check_config(cfg: TrainConfig, source: str = "config") -> None:
    """The options --data cannot go with, named before anything starts."""
    if not cfg.data.url:
        return
    if cfg.run.script:
        raise CaramelError(f"{source}: data.url ({cfg.data.url!r}) feeds a built-in workload; a --script reads its own data")
    expected_sample(cfg)
    if cfg.data.data_order == "locality" and not cfg.data.shuffle:
        raise CaramelError(f"{source}: data.shuffle false: --data-order locality always shuffles each rank's home per "
                           f"epoch (seeded by --seed); use --data-order global for the unshuffled order, or drop "
                           f"--no-shuffle")
    if cfg.data.data_order == "locality" and cfg.data.remainder == "pad":
        raise CaramelError(f"{source}: data.remainder 'pad' repeats samples of the global order; with --data-order "
                           f"locality each rank reads its own home: use --remainder drop or --data-order global")
    from caramel.strategies import STRATEGIES
    spec = STRATEGIES.spec(cfg.parallel.strategy)
    if spec.info.name == "pipeline":
        raise CaramelError(f"{source}: --data does not feed strategy pipeline yet (its stages fetch the pipeline's "
                           f"batch by sample index); use another strategy or drop --data")
    if getattr(spec.options, "balance", "off") == "batch":
        raise CaramelError(f"{source}: --data does not feed balance='batch' (its share sampler cuts the global batch "
                           f"by index); drop balance=batch or --data")


def store_samples(cfg: TrainConfig) -> int:
    """Read the store's index and first sample; CaramelError unless its samples are what the
    workload's model takes. Returns the number of samples the store holds."""
    want = expected_sample(cfg)
    store = Store(cfg.data.url)
    index = store.index()
    info = index.shards[0]
    got = decode_sample(store.read_sample_bytes(info, 0), f"{cfg.data.url}/{info.name} sample 0")
    have = [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in got]
    if have != want:
        raise CaramelError(f"--data {cfg.data.url}: its samples are {_describe(have)}, but workload {cfg.run.workload} "
                           f"takes (input, target) = {_describe(want)}; write a store for it with "
                           f"`caramel data make DIR --workload {cfg.run.workload}`")
    return index.num_samples


def _split_options(cfg: TrainConfig) -> str:
    """The options that decide the workload's training split, as flags with this run's values."""
    split = f"--val-fraction {cfg.data.val_fraction:g}"
    if cfg.run.workload == "char_gpt":
        split += f" --text-bytes {cfg.data.text_bytes} --seq-len {cfg.data.seq_len}"
    return split


def check_store(cfg: TrainConfig, n_train: int | None = None) -> int:
    """`store_samples`, and CaramelError unless the store holds exactly the workload's training
    split (`n_train` samples; computed from the config when not given): a store of another split
    would index past the training set, or train on what this run validates on. Returns n_train."""
    have = store_samples(cfg)
    if n_train is None:
        n_train = len(workload_train_split(cfg))
    if have != n_train:
        split = _split_options(cfg)
        raise CaramelError(f"--data {cfg.data.url}: the store holds {have} samples, but workload {cfg.run.workload}'s "
                           f"training split ({split}) has {n_train}; train with the split options the store was "
                           f"made with, or write it again with `caramel data make DIR --workload "
                           f"{cfg.run.workload} {split}`")
    return n_train


class GlobalOrderSampler(torch.utils.data.Sampler[int]):
    """Rank r's samples in the training loop's own order (`ShardedSampler.indices` step by step),
    stateful for `StatefulDataLoader`: (epoch, samples yielded in it)."""

    def __init__(self, sharded: ShardedSampler):
        self.sharded = sharded
        self.epoch = 0
        self.yielded = 0

    def __len__(self) -> int:
        return self.sharded.steps_per_epoch * self.sharded.batch_size

    def __iter__(self) -> Iterator[int]:
        b = self.sharded.batch_size
        order = torch.cat([self.sharded.indices(self.epoch * self.sharded.steps_per_epoch + s)
                           for s in range(self.sharded.steps_per_epoch)]).tolist()
        for i in order[self.yielded:]:
            self.yielded += 1
            yield i
        assert self.yielded == self.sharded.steps_per_epoch * b
        self.epoch, self.yielded = self.epoch + 1, 0  # an epoch read to its end moves on

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.yielded = int(state["epoch"]), int(state["yielded"])


def default_cache_dir(cfg: TrainConfig) -> str:
    return str(Path(cfg.run.out_dir) / "data-cache")


def clear_default_cache(cfg: TrainConfig, rank: int) -> bool:
    """A fresh (not resumed) run empties this rank's cache when it is the default one inside
    OUT_DIR: the locality order follows what the cache holds when each epoch starts, so a cache
    left by an earlier run would give a fresh run other batches than the same command's first
    run. A given --cache-dir is the user's to keep (shared across runs on purpose). True if
    anything was removed."""
    if cfg.data.cache_dir:
        return False
    mine = Path(default_cache_dir(cfg)) / f"rank{rank}"  # make_loader's per-rank directory
    if not mine.is_dir() or not any(mine.iterdir()):
        return False
    shutil.rmtree(mine)
    return True


def loader_options(cfg: TrainConfig) -> LoaderOptions:
    cache_dir = cfg.data.cache_dir or default_cache_dir(cfg)
    return LoaderOptions(batch_size=cfg.data.batch_size, num_workers=cfg.data.loader_workers,
                         cache_dir=cache_dir, cache_budget_bytes=cfg.data.cache_budget_mib * MIB,
                         locality=True, seed=cfg.run.seed)


class StoreBatches:
    """This rank's training batches from the store, one per step, in step order."""

    def __init__(self, cfg: TrainConfig, sharded: ShardedSampler, rank: int, world_size: int):
        order = GlobalOrderSampler(sharded) if cfg.data.data_order == "global" else None
        self.loader = make_loader(cfg.data.url, rank, world_size, loader_options(cfg), sampler=order)
        self.steps_per_epoch = sharded.steps_per_epoch
        self.sharded, self.order, self.world_size = sharded, cfg.data.data_order, world_size
        assert len(self.loader) == self.steps_per_epoch, (len(self.loader), self.steps_per_epoch)
        self._it: Iterator | None = None
        self._next_step: int | None = None

    def describe(self) -> str:
        """One line for the start banner and the summary: the order these batches are read in."""
        if self.order == "global":
            return f"{self.sharded.describe()}; global order from the store"
        n, used = self.sharded.num_samples, self.steps_per_epoch * self.sharded.batch_size * self.world_size
        return (f"{self.steps_per_epoch} steps/epoch, locality order (each rank reads its home of "
                f"{n // self.world_size} samples, cached shards first; {n - used} samples/epoch unused)")

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        """The next batch (the loop asks for steps in order, from the resumed step on)."""
        assert self._next_step in (None, step), f"step {step} asked after step {self._next_step - 1}"
        self._next_step = step + 1
        if self._it is None:
            self._it = iter(self.loader)
        try:
            return next(self._it)
        except StopIteration:  # an epoch ends; the sampler has moved on to the next one
            self._it = iter(self.loader)
            try:
                return next(self._it)
            except StopIteration:
                raise CaramelError(f"--data: the loader gave no batch for step {step}") from None

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stop the loader's worker processes (they persist across epochs)."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._it = None


def write_workload_store(directory: str | os.PathLike, cfg: TrainConfig, samples_per_shard: int) -> Any:
    """The workload's training split as a store `caramel train --data` reads (its validation split stays out)."""
    expected_sample(cfg)
    train = workload_train_split(cfg)

    def samples():
        for start in range(0, len(train), 256):
            x, y = train.batch(torch.arange(start, min(start + 256, len(train))))
            yield from zip(x, y)

    return write_dataset(directory, samples(), samples_per_shard)


def workload_train_split(cfg: TrainConfig) -> Any:
    """The built-in workload's training split (what a store for it must hold, sample for sample)."""
    from caramel.train.data import char_datasets, digits_datasets

    if cfg.run.workload == "digits":
        return digits_datasets(cfg.data.val_fraction)[0]
    return char_datasets(cfg.data.text_bytes, cfg.data.seq_len, cfg.data.val_fraction)[0]
