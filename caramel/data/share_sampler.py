"""Per-rank shares of one global batch: a schedule every rank holds alike, and its sampler.

Each epoch is one permutation of the dataset (the same seed on every rank), cut into global
batches of `global_batch` samples; global batch i is cut again into contiguous per-rank slices
of `counts[0], counts[1], ...` samples. Whatever the counts, every global batch takes exactly
`global_batch` samples of the permutation, so within an epoch no sample is lost or repeated,
across share changes too.

The counts in force for batch i come from the `ShareSchedule`: a list of (first batch index,
counts). A change is entered at the same call on every rank and takes effect from a batch no
rank has drawn yet (`drawn` travels with the measurements that decide the change), so a loader
that draws ahead (DataLoader workers prefetching) still cuts every batch the same on every rank.
Both carry a `state_dict` so a resumed job continues at the next batch with the same shares.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch


class ShareSchedule:
    """Counts per rank for each global batch index (module docstring)."""

    def __init__(self, global_batch: int, world_size: int, counts: list[int] | None = None):
        if global_batch < world_size:
            raise ValueError(f"global_batch ({global_batch}) must give every one of {world_size} ranks a sample")
        self.global_batch, self.world_size = global_batch, world_size
        counts = counts or equal_counts(global_batch, world_size)
        check_counts(counts, global_batch, world_size)
        self.entries: list[tuple[int, list[int]]] = [(0, list(counts))]
        self.drawn = 0  # batches this rank's sampler has drawn (global index of the next one)

    def counts_for(self, index: int) -> list[int]:
        found = self.entries[0][1]
        for start, counts in self.entries:
            if start > index:
                break
            found = counts
        return found

    @property
    def current(self) -> list[int]:
        return self.entries[-1][1]

    def change(self, counts: list[int], from_index: int) -> None:
        """From batch `from_index` on, `counts` (no rank may have drawn that batch yet)."""
        check_counts(counts, self.global_batch, self.world_size)
        assert from_index >= self.drawn, "a batch already drawn cannot change its cut"
        self.entries = [e for e in self.entries if e[0] < from_index] + [(from_index, list(counts))]

    def state_dict(self) -> dict[str, Any]:
        return {"global_batch": self.global_batch, "entries": [[s, list(c)] for s, c in self.entries],
                "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["global_batch"] != self.global_batch:
            raise ValueError(f"the schedule was saved for a global batch of {state['global_batch']}, "
                             f"this one has {self.global_batch}")
        self.entries = [(int(s), [int(x) for x in c]) for s, c in state["entries"]]
        self.drawn = int(state["drawn"])


class ShareSampler:
    """Yields this rank's list of dataset indices for each global batch (a `batch_sampler`)."""

    def __init__(self, dataset_len: int, schedule: ShareSchedule, rank: int, seed: int = 0):
        if dataset_len < schedule.global_batch:
            raise ValueError(f"a dataset of {dataset_len} samples holds no global batch of {schedule.global_batch}")
        self.dataset_len, self.schedule, self.rank, self.seed = dataset_len, schedule, rank, seed
        self.per_epoch = dataset_len // schedule.global_batch  # the last partial batch is dropped

    def __len__(self) -> int:
        return self.per_epoch

    def _perm(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.dataset_len, generator=torch.Generator().manual_seed(self.seed + epoch))

    def batch(self, index: int) -> list[int]:
        """Rank `rank`'s indices of global batch `index` (epochs run on: index // per_epoch)."""
        epoch, i = divmod(index, self.per_epoch)
        counts = self.schedule.counts_for(index)
        start = i * self.schedule.global_batch + sum(counts[:self.rank])
        return self._perm(epoch)[start:start + counts[self.rank]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch, from the next undrawn batch."""
        end = (self.schedule.drawn // self.per_epoch + 1) * self.per_epoch
        while self.schedule.drawn < end:
            out = self.batch(self.schedule.drawn)
            self.schedule.drawn += 1
            yield out


def equal_counts(global_batch: int, world_size: int) -> list[int]:
    base, extra = divmod(global_batch, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def check_counts(counts: list[int], global_batch: int, world_size: int) -> None:
    if len(counts) != world_size or sum(counts) != global_batch or min(counts) < 1:
        raise ValueError(f"counts {counts} must give each of {world_size} ranks at least one sample and sum to "
                         f"the global batch {global_batch}")
