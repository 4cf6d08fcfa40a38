"""Measure a model's step: when each gradient is ready, when each parameter is first used.

Two pieces, used both by `profile_model` (offline, its own loop) and by the engine (online,
inside the user's loop, before the real plan exists):

- `UseTracker` (one forward): a `TorchFunctionMode` sees every torch call, so any parameter
  passed to an op, even `F.linear(x, self.emb.weight)` from a parent module, is attributed to
  the innermost module running at that moment. It is costly, so it runs for one step only.
- `StepTimer` (the other profiled steps): timestamps from module pre-hooks on the modules
  that use parameters, and from gradient hooks, relative to forward and backward start.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo, ready_orders
from caramel.profile.split_backward import SplitBackward, splittable

SPLIT_STEPS = 2  # steps of the split-backward measurement; each module's fastest weight gradient is kept

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


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The torch.optim class an optimizer is (its own class name when none)."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls is not torch.optim.Optimizer:
            return cls.__name__
    return type(optimizer).__name__


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


def _medians(per_step: list[dict[int, float]]) -> dict[int, float]:
    """Parameter index -> median over the steps that recorded it."""
    keys = sorted({i for d in per_step for i in d})
    return {i: statistics.median(d[i] for d in per_step if i in d) for i in keys}


def build_profile(model_name: str, batch_size: int, module: nn.Module, uses: UseTracker,
                  samples: list[StepSample], meta: dict | None = None) -> ModelProfile:
    """Combine one forward's use information with the median of the timed steps."""
    assert samples, "at least one timed step is needed"
    names, params = unique_params(module)
    med = statistics.median
    fwd = med(s.forward_s for s in samples)
    bwd = med(s.backward_s for s in samples)
    opt = med(s.optimizer_s for s in samples)
    # Modules in order of first use; start time = median pre-hook time (falls back to the use time).
    order = list(uses.module_order)
    mod_start = {}
    for name in order:
        ts = [s.module_start_s[name] for s in samples if name in s.module_start_s]
        mod_start[name] = med(ts) if ts else min((t for m, t in uses.first_use.values() if m == name), default=0.0)
    first_seen = {n: k for k, n in enumerate(order)}
    order.sort(key=lambda n: (mod_start[n], first_seen[n]))
    position = {n: i for i, n in enumerate(order)}
    ready = _medians([s.ready_s for s in samples])
    ready_rank = ready_orders(ready)
    rows_ready = _medians([s.rows_ready_s for s in samples])
    infos = []
    for i, (name, p) in enumerate(zip(names, params)):
        first = uses.first_use.get(i)
        infos.append(ParamInfo(
            index=i, name=name, shape=list(p.shape), dtype=dtype_name(p.dtype), numel=p.numel(),
            bytes=p.numel() * p.element_size(), requires_grad=p.requires_grad,
            ready_order=ready_rank.get(i), ready_time_s=ready.get(i),
            first_use_order=position[first[0]] if first else None,
            first_use_time_s=mod_start[first[0]] if first else None,
            use_modules=list(uses.use_modules.get(i, [])), rows_ready_time_s=rows_ready.get(i),
        ))
    # Backward time of a module: the share of backward between the previous gradient-ready
    # event and the last of its own parameters' ready events.
    bwd_share: dict[str, float] = {n: 0.0 for n in order}
    prev = 0.0
    for i in sorted(ready, key=lambda i: ready[i]):
        first = uses.first_use.get(i)
        if first:
            bwd_share[first[0]] += max(ready[i] - prev, 0.0)
        prev = max(prev, ready[i])
    named = dict(module.named_modules())
    modules = []
    for k, name in enumerate(order):
        end = mod_start[order[k + 1]] if k + 1 < len(order) else fwd
        modules.append(ModuleInfo(
            name=name, type=type(named[name]).__name__ if name in named else "?",
            forward_start_s=mod_start[name], forward_time_s=max(end - mod_start[name], 0.0),
            backward_time_s=bwd_share[name],
            params=[p.index for p in infos if p.first_use_order == k],
        ))
    # what a data-parallel strategy that sends rank 0's buffers at each forward sends: their bytes,
    # in one broadcast per dtype and device (`caramel.distributed.broadcast_coalesced`)
    buffers = list(module.buffers())
    meta = {"buffer_bytes": sum(b.numel() * b.element_size() for b in buffers),
            "buffer_broadcasts": len({(b.dtype, b.device) for b in buffers}),
            # what gossip exchanges beside the parameters (`caramel.strategies.gossip.volume`)
            "float_buffers": {n: b.numel() * b.element_size() for n, b in module.named_buffers() if b.is_floating_point()},
            **_cut_units(module), **(meta or {})}
    return ModelProfile(model_name, batch_size, fwd, bwd, opt, infos, modules, len(samples), meta)


def _cut_units(model: nn.Module) -> dict[str, list[str]]:
    """{"cut_units": names} when a top-level child is a container never called itself (a
    `ModuleList` run in a loop, a `ModuleDict`): the modules a pipeline can cut before are then
    its children (`caramel.strategies.pipeline.units`), and the pipeline simulator groups the
    profile by them; {} otherwise (the top-level children are the units)."""
    containers = (nn.ModuleList, nn.ModuleDict)

    def units(m: nn.Module, prefix: str) -> list[str]:
        out = []
        for name, child in m.named_children():
            out += units(child, f"{prefix}{name}.") if isinstance(child, containers) else [f"{prefix}{name}"]
        return out

    if not any(isinstance(c, containers) for c in model.children()):
        return {}
    return {"cut_units": units(model, "")}


def profile_model(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  optimizer: torch.optim.Optimizer | None = None, steps: int = 3,
                  warmup: int = 1, name: str | None = None, split_tied: bool = True,
                  small_batch_size: int | None = None) -> ModelProfile:
    """Profile `steps` training steps of `model` on one batch (after `warmup` steps).

    Then `SPLIT_STEPS` more steps run with every splittable module's weight gradient deferred
    (`caramel.profile.split_backward`), to time each one apart (`ModuleInfo.weight_grad_time_s`,
    the fastest of those steps, at most the module's backward time; the rest of its measured
    backward is `input_grad_time_s`) and measure what deferring it keeps alive
    (`deferred_bytes`). A module is splittable here when `splittable()` says so, it ran its own
    forward, and no other module uses its parameters (so never a tied embedding or the layer
    sharing its weight). `input_bytes` is measured in the use-tracking forward.

    The model and optimizer are trained for `warmup + steps + 1 + SPLIT_STEPS` steps; pass copies if that
    matters. Without an optimizer, SGD(lr=0) is used so that parameters do not change.
    `split_tied` profiles a tied embedding's weight as the engine trains it by default (its
    gradient ready when the output layer's part is, `caramel.runtime.tied`); set it as you will
    pass it to `caramel.parallelize`. `small_batch_size`: also time every module on the first
    that many samples (`ModelProfile.with_small_batch`), for the pipeline's microbatch model.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if small_batch_size is not None:
        batch = int(inputs.shape[0]) if isinstance(inputs, torch.Tensor) and inputs.dim() > 0 else 1
        if not 0 < small_batch_size < batch:
            raise CaramelError(f"small_batch_size must be in [1, {batch}) (below the batch's {batch} samples), "
                               f"got {small_batch_size}")
        full = profile_model(model, inputs, targets, loss_fn, optimizer, steps, warmup, name, split_tied)
        small = profile_model(model, inputs[:small_batch_size], targets[:small_batch_size], loss_fn, optimizer, steps,
                              warmup, name, split_tied)
        return full.with_small_batch(small)
    names, params = unique_params(model)
    # the optimizer's class, for what gossip's moment-mixing algorithms send (`gossip.volume`)
    opt_meta = {"optimizer": optimizer_class(optimizer)} if optimizer is not None else {}
    optimizer = optimizer or torch.optim.SGD([p for p in params if p.requires_grad], lr=0.0)
    handles = []
    timer_ref: list[StepTimer | None] = [None]

    def on_ready(i):
        def hook(_p):
            if timer_ref[0] is not None:
                timer_ref[0].grad_ready(i)
        return hook

    for i, p in enumerate(params):
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(on_ready(i)))
    # as the engine runs it: a tied embedding's part of the gradient apart (ready times follow)
    from caramel.profile.tied import TiedEmbedding, find_tied_embeddings
    tied = [TiedEmbedding(n, m, i, lambda: True) for n, m, i in find_tied_embeddings(model, params)] if split_tied else []
    for te in tied:
        te.on_rows_ready = lambda i: timer_ref[0].rows_ready(i) if timer_ref[0] is not None else None

    def one_step(timer: StepTimer | None, tracker: UseTracker | None = None, split: SplitBackward | None = None) -> None:
        optimizer.zero_grad(set_to_none=True)
        if timer:
            timer.forward_start()
        if tracker:
            with tracker:
                loss = loss_fn(model(inputs), targets)
        elif split:
            with split.recording():
                loss = loss_fn(model(inputs), targets)
        else:
            loss = loss_fn(model(inputs), targets)
        if timer:
            timer.backward_start()
        loss.backward()
        if timer:
            timer.backward_end()
        if split:
            for m in split.modules:
                split_bytes[m] = split.deferred_bytes(m)
            split.run()
            for m, sec in split.last_run_s.items():
                split_s[m] = min(split_s.get(m, sec), sec)
        for te in tied:
            te.fold_into_weight()
        t = time.perf_counter()
        optimizer.step()
        if timer:
            timer.step_end(time.perf_counter() - t)

    split_s: dict[nn.Module, float] = {}
    split_bytes: dict[nn.Module, int] = {}
    input_bytes: dict[str, int] = {}
    try:
        for _ in range(warmup):
            one_step(None)
        tracker = UseTracker(model, params)
        sizes = InputSizes(model, input_bytes)
        try:
            one_step(None, tracker)
        finally:
            sizes.remove()
        timer = StepTimer(model, tracker.module_order)
        timer_ref[0] = timer
        try:
            for _ in range(steps):
                one_step(timer)
        finally:
            timer.remove()
        timer_ref[0] = None
        named = dict(model.named_modules())
        mods = [named[n] for n in deferrable_modules(model, params, tracker)]
        if mods:
            split = SplitBackward(mods, time_modules=True)
            split.install()
            try:
                for _ in range(SPLIT_STEPS):
                    one_step(None, split=split)
            finally:
                split.remove()
    finally:
        for h in handles:
            h.remove()
        for te in tied:
            te.remove()
        optimizer.zero_grad(set_to_none=True)
    batch = int(inputs.shape[0]) if isinstance(inputs, torch.Tensor) and inputs.dim() > 0 else 1
    prof = build_profile(name or type(model).__name__, batch, model, tracker, timer.samples,
                         meta={"torch": torch.__version__, "threads": torch.get_num_threads(), **opt_meta})
    add_split_backward(prof, model, split_s, split_bytes, input_bytes)
    return prof


def deferrable_modules(model: nn.Module, params: list[nn.Parameter], tracker: UseTracker) -> list[str]:
    """Names of the modules whose weight gradients a plan may defer, in forward order."""
    named = dict(model.named_modules())
    return [n for n in tracker.module_order if n in named and _deferrable(named[n], n, params, tracker)]


def _deferrable(module: nn.Module, name: str, params: list[nn.Parameter], tracker: UseTracker) -> bool:
    """Whether the profiler measures `module`'s split backward: splittable, and every parameter
    it holds used by it alone (a tied weight's rows, and a weight shared with another module,
    keep autograd's order)."""
    if not splittable(module):
        return False
    index = {id(p): i for i, p in enumerate(params)}
    for p in module.parameters(recurse=False):
        i = index.get(id(p))
        if i is None or tracker.use_modules.get(i, [name]) != [name]:
            return False
    return True


def add_split_backward(prof: ModelProfile, model: nn.Module, weight_s: dict[nn.Module, float],
                       deferred: dict[nn.Module, int], input_bytes: dict[str, int]) -> None:
    """Fill the split-backward fields of `prof.modules` from the split steps' measurements:
    weight gradient = the fastest measured, at most the module's backward; input gradient = the
    rest of its backward (so the two sum to `backward_time_s`)."""
    named = dict(model.named_modules())
    for info in prof.modules:
        info.input_bytes = input_bytes.get(info.name)
        m = named.get(info.name)
        if m is None or m not in weight_s or m not in deferred:
            continue
        w = min(weight_s[m], info.backward_time_s)
        info.splittable = True
        info.weight_grad_time_s = w
        info.input_grad_time_s = info.backward_time_s - w
        info.deferred_bytes = deferred[m]


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
