"""Flat gradient buckets: one buffer per plan bucket, reused every step.

Layout of a bucket's buffer: the gradients of its parameters, in plan order, then one
*usage flag* per parameter (1 where the gradient came from this rank's backward). The flags
travel in the bucket's last collective, so after the reduction every rank knows, at no extra
collective, which parameters were used on any rank: a parameter no rank used keeps
`grad=None` for the optimizer, as DDP does.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from caramel.plan.plan import Bucket


class FlatBucket:
    """Runtime state of one plan bucket."""

    def __init__(self, spec: Bucket, params: list[nn.Parameter], world_size: int):
        assert len(spec.params) == len(params)
        self.spec = spec
        self.id = spec.id
        self.params = params
        self.indices = list(spec.params)
        dtype = params[0].dtype
        device = params[0].device
        self.offsets = []
        off = 0
        for p in params:
            assert p.dtype == dtype, f"bucket {spec.id} mixes dtypes"
            self.offsets.append(off)
            off += p.numel()
        self.numel = off
        self.flat = torch.zeros(off + len(params), dtype=dtype, device=device)
        self.flags = self.flat[off:]
        # per-parameter slots, made once: the gradient hook is on every step's critical path
        self.slots = [self.flat[o:o + p.numel()] for o, p in zip(self.offsets, params)]
        self._flag_values = [0.0] * len(params)
        self.scale = 1.0 / world_size
        self.local_slot = {idx: j for j, idx in enumerate(self.indices)}
        # chunk views: the last chunk carries the usage flags
        self.chunks = []
        for c in range(spec.num_chunks):
            start, end = spec.chunk_bounds(c)
            if c == spec.num_chunks - 1:
                end = self.flat.numel()
            self.chunks.append(self.flat[start:end])
        self.works: list = [None] * len(self.chunks)
        self.new_iteration()

    def new_iteration(self) -> None:
        """Ready to collect the next backward's gradients (collectives in flight are kept)."""
        self.pending = len(self.params)
        self.fired = [False] * len(self.params)
        self.ready = False

    def grad_view(self, j: int) -> torch.Tensor:
        return self.slots[j].view_as(self.params[j])

    def put(self, j: int, grad: torch.Tensor | None) -> None:
        """Store this rank's gradient of parameter j, pre-divided by the world size (as DDP does).

        The usage flag is written into the buffer by `seal()`, once the bucket is complete.
        """
        dst = self.slots[j]
        if grad is None:
            dst.zero_()
            self._flag_values[j] = 0.0
        else:
            torch.mul(grad.reshape(-1), self.scale, out=dst)
            self._flag_values[j] = 1.0
        self.fired[j] = True
        self.pending -= 1

    def seal(self) -> None:
        """Every gradient is in: write the usage flags (one copy), before any chunk is sent."""
        assert self.pending == 0
        self.flags.copy_(torch.tensor(self._flag_values, dtype=self.flags.dtype))

    def used(self) -> list[bool]:
        """After the reduction: which parameters had a gradient on some rank."""
        return (self.flags > 0).tolist()
