"""bsp: rank 0's buffers (BatchNorm statistics), sent at step() ahead of the pulls.

DDP broadcasts rank 0's buffers as each training forward starts, and the ps engine did the
same. Under ps that small broadcast leaves rank 0 just after rank 0's own pulls were handed
to the link, so it waits in the queue behind them, and the forward cannot start before it
lands: on ResNet-18/16 at 335 Mbit/s every forward began only once most pulls were through,
whatever their order (TicTac's measured S was 0.97 where the forward is a third of the pulls:
the wait was counted as compute). Sent as step() hands over the pulls, before them, it is
never behind them; the next training forward only copies it in.

The buffers sent are rank 0's as its step() leaves them, the ones DDP would send at the next
training forward unless rank 0 changes them in between (a train-mode forward outside the
training step, say): then the other ranks get the values of step() (docs/ps.md, Limits).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn


class EarlyBuffers:
    """One early broadcast of `module`'s buffers from global rank `src`, per dtype and device."""

    def __init__(self, module: nn.Module, src: int, group: Any):
        self.module, self.src, self.group = module, src, group
        self.pending: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []
        self.taken = 0  # forwards that took buffers sent early

    def send(self) -> None:
        """Every rank, at step(), before the pulls are handed over."""
        self.drop()
        kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in self.module.buffers():
            kinds.setdefault((t.dtype, t.device), []).append(t)
        with torch.no_grad():
            for same in kinds.values():
                flat = torch._utils._flatten_dense_tensors([t.detach() for t in same])
                self.pending.append((dist.broadcast(flat, src=self.src, group=self.group, async_op=True), flat, same))

    def take(self) -> bool:
        """At a training forward: copy in what was sent early; False when nothing was (the
        caller then broadcasts as DDP does)."""
        if not self.pending:
            return False
        receiving = dist.get_rank() != self.src
        with torch.no_grad():
            for work, flat, same in self.pending:
                work.wait()
                if receiving:
                    for t, view in zip(same, torch._utils._unflatten_dense_tensors(flat, same)):
                        t.copy_(view)
        self.pending = []
        self.taken += 1
        return True

    def drop(self) -> None:
        """Finish a send no forward took (its values are stale by now) without copying it in."""
        for work, _, _ in self.pending:
            work.wait()
        self.pending = []
