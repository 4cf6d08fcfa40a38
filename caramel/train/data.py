"""Datasets that need no download, and the sharding that gives every rank its own samples.

Both datasets hold all samples as tensors and hand out whole batches by index (no DataLoader
workers: the datasets are a few MB and the machines this runs on are small).

Sharding (`ShardedSampler`) is a function of (seed, epoch, step): the epoch's order is a seeded
permutation, global batch `s` is positions `[s*W*B, (s+1)*W*B)` of it and rank `r` takes the
`r`-th slice of `B`. So every rank runs the same number of steps, the shards of one epoch are
disjoint, the data position of a run is just its step count (which makes resuming exact), and
the global batch does not depend on how it is split across ranks.
"""
from __future__ import annotations

import math
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from caramel.errors import CaramelError

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "turtledemo"}


def stdlib_source_files() -> list[Path]:
    """The standard library's own .py files, in a fixed order (sorted walk, tests and site-packages left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise CaramelError(f"char_gpt: the Python standard library directory {root} does not exist; use --workload digits")
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS)
        files += [Path(d) / n for n in sorted(names) if n.endswith(".py")]
    return files


def stdlib_text(max_bytes: int) -> bytes:
    """The first `max_bytes` bytes of the standard library's source, files concatenated in `stdlib_source_files` order."""
    chunks, total = [], 0
    for path in stdlib_source_files():
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


class TokenDataset:
    """Non-overlapping windows of `seq_len + 1` bytes; sample i is (window[:-1], window[1:])."""

    def __init__(self, data: torch.Tensor, seq_len: int):
        assert data.dtype == torch.long and data.dim() == 1
        self.data, self.seq_len = data, seq_len
        self.n = (len(data) - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = indices.view(-1, 1) * self.seq_len + torch.arange(self.seq_len + 1).view(1, -1)
        window = self.data[offsets]
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()


class TensorDataset:
    """Samples stored as two aligned tensors (inputs, targets)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        assert len(inputs) == len(targets)
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[indices], self.targets[indices]


def char_datasets(text_bytes: int, seq_len: int, val_fraction: float) -> tuple[TokenDataset, TokenDataset]:
    """Byte-level train/validation sets from the standard library's source (vocabulary: 256 byte values)."""
    text = stdlib_text(text_bytes)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    cut = int(len(data) * (1.0 - val_fraction))
    train, val = TokenDataset(data[:cut], seq_len), TokenDataset(data[cut:], seq_len)
    if len(train) == 0 or len(val) == 0:
        raise CaramelError(f"char_gpt: {len(text)} bytes of text give {len(train)} training and {len(val)} validation windows of "
                           f"{seq_len + 1} bytes; raise --text-bytes or lower --seq-len")
    return train, val


def digits_datasets(val_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1797 8x8 digit images (scaled to [0, 1]), split by a fixed permutation."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1797))
    n_val = max(1, int(round(len(x) * val_fraction)))
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


@dataclass
class ShardedSampler:
    """Which samples rank `rank` of `world_size` trains on at each step; see the module docstring."""

    num_samples: int
    world_size: int
    rank: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    remainder: str = "drop"  # "drop" the partial last global batch of an epoch, or "pad" it with samples from the start

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.world_size and self.batch_size >= 1
        assert self.remainder in ("drop", "pad"), self.remainder
        if self.num_samples < self.world_size:
            raise CaramelError(f"training set has {self.num_samples} samples but there are {self.world_size} workers; "
                               f"every worker needs at least one sample (use fewer workers or more data)")
        global_batch = self.world_size * self.batch_size
        if self.remainder == "drop":
            if self.num_samples < global_batch:
                raise CaramelError(f"training set has {self.num_samples} samples, fewer than one global batch "
                                   f"({self.world_size} workers x batch size {self.batch_size} = {global_batch}); "
                                   f"lower --batch-size or use --remainder pad")
            self.steps_per_epoch = self.num_samples // global_batch
        else:
            self.steps_per_epoch = math.ceil(self.num_samples / global_batch)
        used = self.steps_per_epoch * global_batch
        self.dropped_per_epoch = max(0, self.num_samples - used)
        self.padded_per_epoch = max(0, used - self.num_samples)
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def order(self, epoch: int) -> torch.Tensor:
        """The global sample order of one epoch, padded to whole global batches when remainder is `pad`."""
        if epoch != self._epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = torch.randperm(self.num_samples, generator=g)
            else:
                order = torch.arange(self.num_samples)
            if self.padded_per_epoch:
                reps = math.ceil(self.padded_per_epoch / self.num_samples)
                order = torch.cat([order] + [order] * reps)[: self.num_samples + self.padded_per_epoch]
            self._epoch, self._order = epoch, order
        return self._order

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, index of the global batch within the epoch) of global step `step` (0-based)."""
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int) -> torch.Tensor:
        """This rank's sample indices for global step `step`."""
        epoch, index = self.position(step)
        start = (index * self.world_size + self.rank) * self.batch_size
        return self.order(epoch)[start:start + self.batch_size]

    def describe(self) -> str:
        """One line for the start banner and the summary: how the epoch's remainder is handled."""
        if self.remainder == "drop":
            return f"{self.steps_per_epoch} steps/epoch, remainder dropped ({self.dropped_per_epoch} samples/epoch unused)"
        return f"{self.steps_per_epoch} steps/epoch, remainder padded ({self.padded_per_epoch} samples/epoch repeated)"


def val_shard(num_samples: int, world_size: int, rank: int) -> torch.Tensor:
    """Validation indices of one rank: every sample exactly once across ranks (shards may differ by one)."""
    return torch.arange(rank, num_samples, world_size)
