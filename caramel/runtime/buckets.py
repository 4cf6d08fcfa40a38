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
        # per-parameter views, made once, shaped like the parameters: the gradient hook and the
        # updates are on every step's critical path
        self.views = [self.flat[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, params)]
        self._flag_values = [0.0] * len(params)
        self._all_used_here = False  # set by seal()
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
        self._grads: list[torch.Tensor | None] = [None] * len(self.params)  # held by put() until seal()
        self.ready = False

    def grad_view(self, j: int) -> torch.Tensor:
        return self.views[j]

    def put(self, j: int, grad: torch.Tensor | None) -> None:
        """This rank's gradient of parameter j (None: it got none). Held, not copied: `seal()`
        copies the whole bucket at once, in one call instead of one per parameter."""
        self._grads[j] = grad
        self._flag_values[j] = 0.0 if grad is None else 1.0
        self.fired[j] = True
        self.pending -= 1

    def seal(self) -> None:
        """Every gradient is in: copy them into the buffer pre-divided by the world size (as DDP
        does), then write the usage flags, before any chunk is sent. A gradient is final once
        its hook has run (a parameter gets one per backward), so copying it later is exact."""
        assert self.pending == 0
        if all(g is not None for g in self._grads):
            torch._foreach_copy_(self.views, self._grads)
        else:
            for j, g in enumerate(self._grads):
                if g is None:
                    self.views[j].zero_()
                else:
                    self.views[j].copy_(g)
        if self.scale != 1.0:
            self.flat[:self.numel].mul_(self.scale)
        self.flags.copy_(torch.tensor(self._flag_values, dtype=self.flags.dtype))
        self._all_used_here = all(v == 1.0 for v in self._flag_values)

    def used(self) -> list[bool]:
        """After the reduction: which parameters had a gradient on some rank (every one when this
        rank's backward gave each a gradient: the sum of the flags is then positive everywhere,
        and reading the flags back is skipped)."""
        if self._all_used_here:
            return [True] * len(self.params)
        return (self.flags > 0).tolist()
