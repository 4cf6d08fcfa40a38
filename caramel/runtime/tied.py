"""Tied embeddings: the embedding's share of a tied weight's gradient travels apart, as rows.

A weight shared by an `nn.Embedding` and a dense layer (GPT-2's input embedding and output
projection) gets its gradient from two places: the output layer's part, dense and computed at
the start of backward, and the embedding's part, computed at the very end and nonzero only in
the rows of the tokens the batch looked up. Summed by autograd, the whole gradient is ready last
and needed first (the next forward starts with the embedding): a transfer window of nothing.
Split, the weight's own gradient is only the dense part, ready early and reduced by the plan's
buckets like any other; the embedding's part is a few rows, gathered from every rank when
backward ends, on a group of its own (so it never queues behind the plan's collectives), and
added to the reduced gradient before the update. All-reduce is linear, so the update is the
same up to the order of the additions.

How, with no change to the model: in a forward whose gradients the engine reduces, the
embedding computes with a detached alias of its weight (same storage, a leaf of its own), so
autograd leaves the embedding's part in the alias's `.grad`; the alias is swapped back when the
module's forward ends, and the tokens it looked up are noted. The profiler uses the same swap
(`TiedEmbedding.fold_into_weight`), so profiles and plans see the early gradient.

Order per step: forward (alias in, ids noted) -> backward (dense part through the buckets, rows
in the alias) -> end of backward `start()` (every rank, the same point: one all-gather of
[k, ids, rows] at an agreed capacity) -> before the update `finish()` (rows added into the
reduced gradient; a rank with more rows than the capacity makes every rank gather again at the
larger one, which all of them read from the same headers). When a gather would carry more than
an all-reduce of the whole weight (many ranks, or most rows looked up), the rows go as a dense
all-reduce instead, decided from the agreed capacity, so on every rank alike.
"""
from __future__ import annotations

from typing import Any

import torch

from caramel.profile.tied import TiedEmbedding

HEADER_BYTES = 8  # the row count, int64


class RowExchange:
    """Every rank's rows of one tied embedding, summed into the reduced gradient (module docstring).

    `pg` is a private process group (or the engine's stand-in for a muted one). Rows are divided
    by the world size before they travel, as the buckets' gradients are."""

    def __init__(self, tied: TiedEmbedding, pg: Any, world_size: int):
        self.tied = tied
        self.pg = pg
        self.world_size = world_size
        w = tied.weight
        self.num_rows, self.row_numel = int(w.shape[0]), int(w[0].numel())
        self.dtype = w.dtype
        self.device = w.device  # the payloads live beside the weight (CUDA tensors go over NCCL)
        self.capacity = 0  # rows per rank in the gather, agreed: it only grows, from the headers
        self.dense = False
        self._work = None
        self._out: list[torch.Tensor] | None = None
        self._mine: tuple[torch.Tensor, torch.Tensor] | None = None

    def _row_bytes(self) -> int:
        return 8 + self.row_numel * self.dtype.itemsize

    def _pack(self, capacity: int) -> torch.Tensor:
        buf = torch.zeros(HEADER_BYTES + capacity * self._row_bytes(), dtype=torch.uint8, device=self.device)
        ids, rows = self._mine if self._mine is not None else (None, None)
        k = 0 if ids is None else int(ids.numel())
        buf[:HEADER_BYTES].view(torch.int64)[0] = k
        if 0 < k <= capacity:
            id_end = HEADER_BYTES + capacity * 8
            buf[HEADER_BYTES:id_end].view(torch.int64)[:k] = ids
            buf[id_end:].view(self.dtype).view(capacity, self.row_numel)[:k] = rows.reshape(k, -1)
        return buf

    def start(self) -> None:
        """End of backward, on every rank at the same point: issue the exchange of this step's rows."""
        assert self._work is None, "the previous step's rows were never added (finish() not called)"
        taken = self.tied.take_rows()
        scale = 1.0 / self.world_size
        self._mine = None if taken is None else (taken[0], taken[1] * scale)
        if self.dense:
            # the whole weight's shape, and one usage flag: whether any rank had rows
            full = torch.zeros(self.num_rows * self.row_numel + 1, dtype=self.dtype, device=self.device)
            if self._mine is not None:
                full[:-1].view(self.num_rows, self.row_numel).index_add_(0, self._mine[0], self._mine[1].reshape(-1, self.row_numel))
                full[-1] = 1.0
            self._out = [full]
            self._work = self.pg.allreduce([full])
            return
        mine = self._pack(self.capacity)
        self._out = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._work = self.pg.allgather([self._out], [mine])

    def pending(self) -> bool:
        return self._work is not None

    def finish(self, grad: torch.Tensor) -> bool:
        """Wait for the exchange and add every rank's rows into `grad` (the reduced gradient's
        view, already divided by the world size). True when some rank had rows."""
        assert self._work is not None and self._out is not None
        self._work.wait()
        self._work = None
        if self.dense:
            full, self._out = self._out[0], None
            grad.add_(full[:-1].view_as(grad))
            return bool(full[-1] > 0)
        counts = [int(b[:HEADER_BYTES].view(torch.int64)[0]) for b in self._out]
        most = max(counts)
        if most > self.capacity:
            # some rank's rows did not fit: every rank sees the same counts, so all gather again
            # at the same larger capacity (with headroom, so this stays rare)
            self.capacity = max(most, self.capacity + self.capacity // 4)
            mine = self._pack(self.capacity)
            self._out = [torch.empty_like(mine) for _ in range(self.world_size)]
            self.pg.allgather([self._out], [mine]).wait()
            if self.world_size * self.capacity > self.num_rows:
                self.dense = True  # a gather would now move more than an all-reduce of the weight
        id_end = HEADER_BYTES + self.capacity * 8
        for k, buf in zip(counts, self._out):
            if k:
                ids = buf[HEADER_BYTES:id_end].view(torch.int64)[:k]
                rows = buf[id_end:].view(self.dtype).view(self.capacity, self.row_numel)[:k]
                grad.index_add_(0, ids, rows.view(k, *grad.shape[1:]))
        self._out, self._mine = None, None
        return most > 0
