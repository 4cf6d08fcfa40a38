"""Tied embeddings: the alias swap that leaves the embedding's part of a tied weight's gradient apart.

A weight shared by an `nn.Embedding` and a dense layer gets its gradient from two places; in a
forward whose gradients are reduced, the embedding computes with a detached alias of its weight
(same storage, a leaf of its own), so autograd leaves the embedding's part in the alias's
`.grad` and the weight's own gradient is ready early. The profiler and the engine both use the
swap, so profiles and plans see the early gradient; `caramel.runtime.tied` moves the rows.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from caramel.profile.recorders import ALIAS_ATTR


def find_tied_embeddings(module: nn.Module, params: list[nn.Parameter]) -> list[tuple[str, nn.Embedding, int]]:
    """(module name, embedding, parameter index) for every `nn.Embedding` whose weight another
    module also holds, the split applies to: dense gradient (`sparse=False`), no `max_norm`
    (which rewrites rows in forward), trainable."""
    holders: dict[int, int] = {}
    for _name, m in module.named_modules(remove_duplicate=False):
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] = holders.get(id(p), 0) + 1
    index = {id(p): i for i, p in enumerate(params)}
    out = []
    for name, m in module.named_modules():
        if (type(m) is nn.Embedding and not m.sparse and m.max_norm is None and m.weight.requires_grad
                and holders.get(id(m.weight), 0) > 1 and id(m.weight) in index):
            out.append((name, m, index[id(m.weight)]))
    return out


class TiedEmbedding:
    """The alias swap for one tied embedding; `active()` says whether this forward splits."""

    def __init__(self, name: str, embedding: nn.Embedding, index: int, active: Callable[[], bool]):
        self.name, self.module, self.index = name, embedding, index
        self.weight = embedding.weight
        self.active = active
        self.alias: torch.Tensor | None = None
        self.ids: list[torch.Tensor] = []
        self.on_rows_ready: Callable[[int], None] | None = None  # profiling: called with `index` when the rows are in
        self._swapped = False
        self._handles = [embedding.register_forward_pre_hook(self._pre),
                         embedding.register_forward_hook(self._post, always_call=True)]

    def _pre(self, m: nn.Module, args: tuple) -> None:
        if not args or not torch.is_grad_enabled() or not self.active():
            return
        if self.alias is None:
            # one alias per step: a second call (the embedding used twice, or recomputed under
            # activation checkpointing) adds to the same `.grad`
            with torch._C.DisableTorchFunction():  # not a use of the weight to a profiler watching
                self.alias = self.weight.detach().requires_grad_(True)
                self.alias.register_post_accumulate_grad_hook(self._rows_in)
            setattr(self.alias, ALIAS_ATTR, self.weight)
        self.ids.append(args[0].detach().reshape(-1))
        m._parameters["weight"] = self.alias
        self._swapped = True

    def _rows_in(self, _alias: torch.Tensor) -> None:
        if self.on_rows_ready is not None:
            self.on_rows_ready(self.index)

    def _post(self, m: nn.Module, _args: tuple, _out: Any) -> None:
        if self._swapped:
            m._parameters["weight"] = self.weight
            self._swapped = False

    def take_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This step's (ids, rows) of the embedding's gradient part, each id once, and reset for
        the next step; None when the split did not run (or left no gradient)."""
        alias, ids = self.alias, self.ids
        self.alias, self.ids = None, []
        if alias is None or alias.grad is None:
            return None
        uids = torch.unique(torch.cat(ids))
        return uids, alias.grad.index_select(0, uids)

    def fold_into_weight(self) -> None:
        """Without communication (the profiler): add the embedding's part into the weight's own
        gradient, so the optimizer sees the whole gradient."""
        taken = self.take_rows()
        if taken is None:
            return
        ids, rows = taken
        if self.weight.grad is None:
            self.weight.grad = torch.zeros_like(self.weight)
        self.weight.grad.index_add_(0, ids, rows)

    def remove(self) -> None:
        self._post(self.module, (), None)
        for h in self._handles:
            h.remove()
        self._handles = []
