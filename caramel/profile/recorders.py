"""What a profiled step records, through hooks on the model (`caramel.profile.profiler` runs them).

- `UseTracker` (one forward): a `TorchFunctionMode` sees every torch call, so any parameter
  passed to an op, even `F.linear(x, self.emb.weight)` from a parent module, is attributed to
  the innermost module running at that moment. It is costly, so it runs for one step only.
- `StepTimer` (the other profiled steps): timestamps from module pre-hooks on the modules
  that use parameters, and from gradient hooks, relative to forward and backward start.
- `InputSizes` (the use-tracking forward): the bytes each module's forward is called with.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

ALIAS_ATTR = "_caramel_alias_of"  # on a tied embedding's alias: the parameter it stands for


def unique_params(module: nn.Module) -> tuple[list[str], list[nn.Parameter]]:
    """Parameters in registration order, each once (a tied parameter under its first name)."""
    names, params, seen = [], [], set()
    for name, p in module.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            names.append(name)
            params.append(p)
    return names, params


class _ModuleStack:
    """Which module is running: pushed by forward pre-hooks, popped by forward hooks."""

    def __init__(self, module: nn.Module):
        self.stack: list[str] = []
        self.handles = []
        for name, m in module.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._push(name)))
            self.handles.append(m.register_forward_hook(self._pop(name), always_call=True))

    def _push(self, name: str):
        def hook(_m, _args):
            self.stack.append(name)
        return hook

    def _pop(self, name: str):
        def hook(_m, _args, _out):
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
        return hook

    def current(self) -> str:
        return self.stack[-1] if self.stack else ""

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class _UseMode(TorchFunctionMode):
    def __init__(self, tracker: "UseTracker"):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = self.tracker
        for leaf in tree_flatten((args, kwargs))[0]:
            if not isinstance(leaf, torch.Tensor):
                continue
            # a tied embedding's alias (`caramel.runtime.tied`) is a use of the weight it stands for
            idx = t.param_ids.get(id(getattr(leaf, ALIAS_ATTR, leaf)))
            if idx is not None:
                t.note_use(idx)
        return func(*args, **kwargs)


class UseTracker:
    """Records, for one forward, which module first uses each parameter and in what order."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter]):
        self.module = module
        self.param_ids = {id(p): i for i, p in enumerate(params)}
        self.first_use: dict[int, tuple[str, float]] = {}  # param -> (module, seconds from forward start)
        self.use_modules: dict[int, list[str]] = {}
        self.module_order: list[str] = []  # modules in order of their first parameter use
        self.t0 = 0.0
        self._stack: _ModuleStack | None = None
        self._mode: _UseMode | None = None

    def note_use(self, idx: int) -> None:
        mod = self._stack.current() if self._stack else ""
        if idx not in self.first_use:
            self.first_use[idx] = (mod, time.perf_counter() - self.t0)
        uses = self.use_modules.setdefault(idx, [])
        if mod not in uses:
            uses.append(mod)
        if mod not in self.module_order:
            self.module_order.append(mod)

    def __enter__(self) -> "UseTracker":
        self._stack = _ModuleStack(self.module)
        self.t0 = time.perf_counter()
        self._mode = _UseMode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        assert self._mode is not None and self._stack is not None
        self._mode.__exit__(*exc)
        self._stack.remove()


@dataclass
class StepSample:
    """Timings of one profiled step (seconds)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    module_start_s: dict[str, float] = field(default_factory=dict)  # from forward start
    ready_s: dict[int, float] = field(default_factory=dict)  # from backward start
    rows_ready_s: dict[int, float] = field(default_factory=dict)  # a split tied weight's rows, from backward start


class StepTimer:
    """Light timing of profiled steps: pre-hooks on modules that use parameters, gradient-ready times."""

    def __init__(self, module: nn.Module, modules: list[str]):
        self.samples: list[StepSample] = []
        self.cur: StepSample | None = None
        self.t_forward = self.t_backward = 0.0
        self.handles = []
        named = dict(module.named_modules())
        for name in modules:
            if name in named:
                self.handles.append(named[name].register_forward_pre_hook(self._hook(name)))

    def _hook(self, name: str):
        def hook(_m, _args):
            if self.cur is not None and name not in self.cur.module_start_s:
                self.cur.module_start_s[name] = time.perf_counter() - self.t_forward
        return hook

    def forward_start(self) -> None:
        self.cur = StepSample()
        self.t_forward = time.perf_counter()

    def backward_start(self) -> None:
        assert self.cur is not None
        self.t_backward = time.perf_counter()
        self.cur.forward_s = self.t_backward - self.t_forward

    def grad_ready(self, idx: int) -> None:
        if self.cur is not None and idx not in self.cur.ready_s:
            self.cur.ready_s[idx] = time.perf_counter() - self.t_backward

    def rows_ready(self, idx: int) -> None:
        """A split tied weight's rows (the embedding's part of its gradient) are ready."""
        if self.cur is not None and idx not in self.cur.rows_ready_s:
            self.cur.rows_ready_s[idx] = time.perf_counter() - self.t_backward

    def backward_end(self) -> None:
        if self.cur is not None:
            self.cur.backward_s = time.perf_counter() - self.t_backward

    def step_end(self, optimizer_s: float) -> None:
        if self.cur is not None:
            self.cur.optimizer_s = optimizer_s
            self.samples.append(self.cur)
            self.cur = None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class InputSizes:
    """Bytes of the tensors each module's forward is called with (summed over calls), one forward."""

    def __init__(self, module: nn.Module, out: dict[str, int]):
        self.handles = [m.register_forward_pre_hook(self._hook(name, out)) for name, m in module.named_modules()]

    @staticmethod
    def _hook(name: str, out: dict[str, int]):
        def hook(_m, args):
            n = sum(t.numel() * t.element_size() for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor))
            out[name] = out.get(name, 0) + n
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
