"""The reduction as the engine's callers see it: handing it to torch DDP, and the reduced gradients.

A mixin of `caramel.runtime.engine.Engine`, apart only to keep each file to one concern; it reads
the engine's state (buckets, pending updates, `delegating`), whose meaning the engine's module
docstring gives.

Delegation: when an overlap trial keeps DDP's schedule, the controller hands the gradients to
torch's own `DistributedDataParallel` (`delegate_to`): its C++ reducer runs the same buckets with
less per-step cost than the engine's Python hooks. The engine's hooks stand aside
(`delegating`), `step()` lets the user's optimizer run on the gradients DDP averaged into
`p.grad`, and `take_back` returns to the engine's own plan. Either way, a caller that needs the
averaged gradients before the update (gradient clipping, an optimizer closure) reads them here.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn


class EngineReduced:
    """DDP delegation and access to the reduced gradients (see the module docstring)."""

    def delegate_to(self, ddp: nn.Module, group: Any = None, wait_s: Callable[[], float] | None = None) -> None:
        """Hand gradient reduction to torch DDP wrapped around this engine's module (module
        docstring); `group` is a process group made for it, destroyed with the engine's groups;
        `wait_s`, where DDP's communication hook times it, gives each step's exposed wait (else
        a delegated step counts none). Nothing may be pending."""
        assert not self._pending_apply and not self._callback_queued
        self.ddp = ddp
        if group is not None:
            self._ddp_group = group
        self.delegated_wait_s = wait_s
        self.delegating = True

    def take_back(self) -> None:
        """Reduce gradients with the engine's own plan again (after a delegation)."""
        self.delegating = False

    def wait_reduced(self) -> None:
        """Wait for every outstanding collective without applying (for gradient clipping)."""
        if self.delegating:
            return  # DDP's backward returns only once every bucket is reduced
        self._wait(sorted(self._pending_apply))

    def reduced_grads(self) -> list[torch.Tensor]:
        """Views of the averaged gradients of globally used parameters of pending buckets."""
        if self.delegating:
            return [p.grad for p in self.params if p.grad is not None]
        out = []
        for b in sorted(self._pending_apply):
            fb = self.buckets[b]
            used = fb.used()
            out.extend(fb.grad_view(j) for j in range(len(fb.params)) if used[j])
        return out

    def gradients_to_params(self) -> None:
        """Wait for the reduction and put the averaged gradients into `p.grad` (DDP's way), for
        optimizers that read gradients themselves (closures). Nothing stays pending."""
        if not self._reduced:
            return
        todo = sorted(self._pending_apply)
        self._wait(todo)
        for b in todo:
            fb = self.buckets[b]
            for j, used in enumerate(fb.used()):
                fb.params[j].grad = fb.grad_view(j).clone() if used else None
        self._pending_apply.clear()
        self._reduced = False

    def has_unapplied_reduction(self) -> bool:
        if self.delegating:
            return any(p.grad is not None for p in self.params)
        return self._reduced
