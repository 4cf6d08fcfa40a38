"""Measure a model's step: when each gradient is ready, when each parameter is first used.

`profile_model` runs its own loop: warm-up steps, one forward under `UseTracker` (which module
first uses each parameter), timed steps under `StepTimer` (`caramel.profile.recorders`), then
the split-backward steps; `caramel.profile.assemble` turns the records into a `ModelProfile`.
The engine uses the same recorders and assembly online, inside the user's loop, before the
real plan exists. The names of both modules are importable from here as well.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.assemble import add_split_backward, build_profile, deferrable_modules, dtype_name
from caramel.profile.model_profile import ModelProfile
from caramel.profile.recorders import ALIAS_ATTR, InputSizes, StepSample, StepTimer, UseTracker, unique_params
from caramel.profile.split_backward import SplitBackward
from caramel.profile.tied import TiedEmbedding, find_tied_embeddings

__all__ = ["ALIAS_ATTR", "SPLIT_STEPS", "InputSizes", "StepSample", "StepTimer", "UseTracker", "add_split_backward",
           "build_profile", "deferrable_modules", "dtype_name", "optimizer_class", "profile_model", "unique_params"]

SPLIT_STEPS = 2  # steps of the split-backward measurement; each module's fastest weight gradient is kept


def optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The torch.optim class an optimizer is (its own class name when none)."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls is not torch.optim.Optimizer:
            return cls.__name__
    return type(optimizer).__name__


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
                split_bytes[m] = split.deferred_bytes(m, whole=True)
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
