"""Split backward: input gradients now, chosen layers' weight gradients later, in a chosen order.

Autograd computes each layer's input and weight gradients together, last layer first, so the
first layer's weight gradient, the one the next forward needs first, is the last to exist. For
the layers named here (Linear, Conv1d, Conv2d, Embedding), a forward under `recording()` runs
through a function whose backward returns only the input gradient and keeps (input, output
gradient); `run()` then computes the kept weight gradients in the order given (first layer
first), accumulating into `.grad` and calling `on_ready(param)` as each exists, so a transfer
can start while later layers' weight gradients are still being computed.

The same kernels as autograd (aten `convolution_backward`, `grad_output^T @ input`), so the same bits, in
another order: a deferred layer keeps its input and output gradient until `run()`, which is the
extra memory `deferred_bytes()` reports. Layers this cannot split (a padding mode other than
zeros, an embedding with `max_norm`, `sparse` or `scale_grad_by_freq`, frozen weights) keep
autograd's order; `splittable()` says which.

The other way round, a dense layer named `early` computes its weight gradient inside backward
*before* its input gradient and hands it over at once: in a network whose first gradient to be
ready is a large layer's (a language model's output layer), the transfer starts while that
layer's input gradient is still being computed, instead of after it. Nothing is kept.

Structured dropout (`caramel.profile.dropout_groups`) narrows some of the same layers: its
forward sits above the split one (`wraps_forward`) and, while both are on, computes through
`narrow_forward`, which splits the narrow layer the same way: its backward returns the input
gradient and keeps the narrow input and output gradient with the kept indices; the weight
gradient is then computed on the narrow weight and scattered into a dense one as autograd's
`index_select` backward does (zeros, `index_add_`), so deferred, early and autograd's narrow
gradients are the same bits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.split_ops import (_DenseSplit, _EmbeddingSplit, _NarrowSplit, _accumulate,
                                        dense_weight_grads)

SPLIT_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)


def splittable(module: nn.Module) -> bool:
    """Whether `module`'s weight gradient can be computed apart from its input gradient here."""
    if type(module) not in SPLIT_TYPES or not module.weight.requires_grad:
        return False
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return module.padding_mode == "zeros" and not isinstance(module.padding, str)
    if isinstance(module, nn.Embedding):
        return module.max_norm is None and not module.sparse and not module.scale_grad_by_freq
    return True


@dataclass
class _Pending:
    module: nn.Module
    # (input, grad_output, kept output rows, kept input columns) per call in the forward; the
    # indices are None for a layer computed whole
    saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]


class SplitBackward:
    """Defers the weight gradients of `modules` (in the order their weight gradients should be
    computed) for every forward run under `recording()`; `run()` computes them.

    With `time_modules=True`, `run()` also times each module's weight-gradient computation
    (synchronizing the device first for CUDA weights): `last_run_s` maps each module that ran
    to its seconds, in run order (the profiler's measurement of `ModuleInfo.weight_grad_time_s`)."""

    def __init__(self, modules: list[nn.Module], on_ready: Callable[[nn.Parameter], None] | None = None,
                 time_modules: bool = False, on_keep: Callable[[], None] | None = None,
                 early: list[nn.Module] = ()):
        bad = [type(m).__name__ for m in list(modules) + list(early) if not splittable(m)]
        if bad:
            raise ValueError(f"cannot split the backward of {', '.join(bad)} (see splittable())")
        bad = [type(m).__name__ for m in early if isinstance(m, nn.Embedding)]
        if bad or any(m in modules for m in early):
            raise ValueError("an early weight gradient needs a dense layer that is not also deferred")
        self.modules = list(modules)
        self.early = list(early)
        self._early_ids = {id(m) for m in early}
        self._calls: dict[int, int] = {}  # early module -> its recorded calls whose backward has not run
        self._handovers = 0  # early weight gradients handed over inside backward (see `handovers`)
        self.on_ready = on_ready
        self.on_keep = on_keep  # called inside backward each time a weight gradient is deferred
        self.time_modules = time_modules
        self.last_run_s: dict[nn.Module, float] = {}
        self._pending: dict[int, _Pending] = {}
        self._handles: list[Any] = []
        self._active = False
        # The splitting functions take the weights from their module, not as inputs: autograd
        # then has no edge to a weight, so nothing accumulates into it and no gradient hook of
        # it fires (a hook fires even for a None gradient). This leaf ties their outputs into
        # the graph when their input needs no gradient (the first layer's data).
        self._anchor = torch.zeros((), requires_grad=True)
        # held so the node stays the one the graphs use: a backward that will not execute it
        # (`torch.autograd.grad`, `backward(inputs=...)` without the parameters) accumulates into
        # no `.grad`, so a split weight gradient must not either
        self._anchor_node = torch.autograd.graph.get_gradient_edge(self._anchor).node

    # -- forward: route the modules through the splitting functions
    def install(self) -> None:
        """Give each module a forward that splits while recording (an instance attribute over the
        class's forward, so hooks, `module.weight` swaps and the user's code are untouched)."""
        for m in self.modules + self.early:
            fwd = self._splitting_forward(m)
            top = m.__dict__.get("forward")
            if getattr(top, "wraps_forward", False):
                top.below = fwd  # a narrowing forward stays on top and calls this one
            else:
                m.forward = fwd
            self._handles.append((m, fwd))

    def remove(self) -> None:
        """Take this split's forwards out, wherever they sit (a narrowing forward above stays)."""
        for m, fwd in self._handles:
            top = m.__dict__.get("forward")
            if top is fwd:
                del m.forward
            elif getattr(top, "wraps_forward", False) and top.below is fwd:
                top.below = None
        self._handles.clear()

    def recording(self) -> "_Recording":
        """`with split.recording(): loss = model(x) ...`: forwards inside are split."""
        return _Recording(self)

    def set_recording(self, active: bool) -> None:
        """The same as entering (True) or leaving (False) `recording()`, for callers whose
        forward starts and ends in different hooks."""
        self._active = active

    def _splitting_forward(self, module: nn.Module) -> Callable[..., torch.Tensor]:
        plain = type(module).forward.__get__(module)

        def forward(inp: torch.Tensor) -> torch.Tensor:
            if not self._active or not torch.is_grad_enabled():
                return plain(inp)
            if id(module) in self._early_ids:
                self._calls[id(module)] = self._calls.get(id(module), 0) + 1
            if isinstance(module, nn.Embedding):
                return _EmbeddingSplit.apply(inp, self._anchor, self, module)
            return _DenseSplit.apply(inp, self._anchor, self, module)
        forward.split = self  # how a narrowing forward above finds the split it calls
        return forward

    def splits_now(self) -> bool:
        """Whether a forward now is split (recording, with autograd on)."""
        return self._active and torch.is_grad_enabled()

    def narrow_forward(self, module: nn.Module, inp: torch.Tensor, out_k: torch.Tensor | None,
                       cols: torch.Tensor | None) -> torch.Tensor:
        """`module` computed on its kept output rows `out_k` and input columns `cols` (None: all;
        `inp` already holds only those columns), split like the whole layer (module docstring)."""
        if id(module) in self._early_ids:
            self._calls[id(module)] = self._calls.get(id(module), 0) + 1
        return _NarrowSplit.apply(inp, self._anchor, self, module, out_k, cols)

    def accumulating(self) -> bool:
        """Inside a split module's backward: whether this backward accumulates into `.grad` (a
        `.backward()`), not a `torch.autograd.grad` or a `backward(inputs=...)` that leaves the
        weights out. Raises for `create_graph=True`: the split input gradient carries no graph
        through the weight, so a second derivative through it would be silently wrong."""
        if torch.is_grad_enabled():
            raise CaramelError(
                "backward(create_graph=True) (a double backward, e.g. a gradient penalty) runs through "
                "a layer whose weight gradient caramel computes apart; pass early_weight_grad=False and "
                "compute_schedule='off' to parallelize(), or take the second derivative outside it")
        return torch._C._will_engine_execute_node(self._anchor_node)

    def _early(self, module: nn.Module, inp: torch.Tensor, grad_out: torch.Tensor,
               out_k: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> bool:
        """An early module's weight gradient, computed and handed over now (before its input
        gradient); False for a deferred module."""
        if id(module) not in self._early_ids or self._calls.get(id(module), 0) != 1:
            return False  # deferred, or called more than once: its gradient is a sum, kept for run()
        self._calls[id(module)] = 0
        self._handovers += 1
        with torch.no_grad():
            gw, gb = dense_weight_grads(module, inp, grad_out, out_k, cols)
            _accumulate(module.weight, gw)
            has_bias = gb is not None and module.bias is not None and module.bias.requires_grad
            if has_bias:
                _accumulate(module.bias, gb)
        if self.on_ready is not None:
            self.on_ready(module.weight)
            if has_bias:
                self.on_ready(module.bias)
        return True

    @property
    def handovers(self) -> int:
        """How many early weight gradients were handed over before their input gradient, in
        total (the fallback that keeps a gradient for `run()` is also exact, so only this count
        tells that the early path ran)."""
        return self._handovers

    def _keep(self, module: nn.Module, inp: torch.Tensor, grad_out: torch.Tensor,
              out_k: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> None:
        self._pending.setdefault(id(module), _Pending(module, [])).saved.append((inp, grad_out, out_k, cols))
        if self.on_keep is not None:
            self.on_keep()

    # -- after backward
    def pending(self) -> bool:
        return bool(self._pending)

    def deferred_bytes(self, module: nn.Module | None = None, whole: bool = False) -> int:
        """Bytes held for the weight gradients not yet computed (inputs and output gradients), of
        every module or of `module` only. `whole`: what the whole layers would hold, a narrowed
        entry's input scaled by the layer's inputs / kept columns and its gradient by outputs /
        kept rows (a profile taken while a rank drops plans for steps that may drop nothing)."""
        pending = self._pending.values() if module is None else [p for k, p in self._pending.items() if k == id(module)]
        if not whole:
            return sum(t.numel() * t.element_size() for p in pending for kept in p.saved for t in kept if t is not None)
        total = 0
        for p in pending:
            w = p.module.weight
            for inp, g, out_k, cols in p.saved:
                # the kept columns / rows are the input's and the gradient's channel (feature) dim
                total += _scaled_bytes(inp, cols, w.shape[1]) + _scaled_bytes(g, out_k, w.shape[0])
        return total

    def run(self) -> None:
        """Compute every kept weight gradient, in `modules` order; accumulate into `.grad`."""
        self.last_run_s = {}
        with torch.no_grad():
            for m in self.modules + self.early:
                self._calls.pop(id(m), None)
                p = self._pending.pop(id(m), None)
                if p is None:
                    continue
                sync = self.time_modules and m.weight.is_cuda
                if sync:
                    torch.cuda.synchronize(m.weight.device)
                t0 = time.perf_counter()
                for inp, g, out_k, cols in p.saved:
                    gw, gb = dense_weight_grads(m, inp, g, out_k, cols)
                    _accumulate(m.weight, gw)
                    if gb is not None and m.bias is not None and m.bias.requires_grad:
                        _accumulate(m.bias, gb)
                if self.time_modules:
                    if sync:
                        torch.cuda.synchronize(m.weight.device)
                    self.last_run_s[m] = time.perf_counter() - t0
                if self.on_ready is not None:
                    self.on_ready(m.weight)
                    if getattr(m, "bias", None) is not None and m.bias.requires_grad:
                        self.on_ready(m.bias)
        self._pending.clear()


class _Recording:
    def __init__(self, split: SplitBackward):
        self.split = split

    def __enter__(self) -> SplitBackward:
        self.split._active = True
        return self.split

    def __exit__(self, *exc) -> None:
        self.split._active = False


def _scaled_bytes(t: torch.Tensor, kept: torch.Tensor | None, units: int) -> int:
    """Bytes of `t` had all `units` of its narrowed dim been kept (`kept`: those that were)."""
    n = t.numel() * t.element_size()
    return n if kept is None else n // len(kept) * units
