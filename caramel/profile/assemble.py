"""A profile from what the hooks recorded: one forward's parameter uses and the timed steps' medians.

`build_profile` orders the modules by when they start, gives each the share of backward up to
its parameters' gradients, and adds what strategies read beside the timings (buffers, cut
units); `add_split_backward` fills in the split-backward steps' measurements.
"""
from __future__ import annotations

import statistics

import torch
import torch.nn as nn

from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo, ready_orders
from caramel.profile.recorders import StepSample, UseTracker, unique_params
from caramel.profile.split_backward import splittable


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


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
