"""Where a model that is no `nn.Sequential` may be cut: its units in the order they run.

`partition="auto"` on an `nn.Sequential` cuts between children. Any other model is cut by
torch's tracer before named modules (`traced_stages` below); to choose those names the
partitioner needs the same thing a Sequential gives for free: a chain of units with a cost and
an activation size each. The units are the model's top-level children, with containers that
are never called themselves (an `nn.ModuleList` run in a loop, an `nn.ModuleDict`) replaced by
their children, ordered by when each first runs in one forward pass. A unit that runs twice in
one forward (a shared module) is no cut point: the error asks for the partition by name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.pipeline.planner import LayerCost
from caramel.strategies.pipeline.tied import TiedWeight, share_tied

_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


@dataclass(frozen=True)
class Unit:
    name: str  # the module's qualified name in the model (what torch's SplitPoint takes)
    output_bytes: int  # its output activation, per `sample`


def _candidates(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    out = []
    for name, child in model.named_children():
        full = f"{prefix}{name}"
        if isinstance(child, _CONTAINERS):
            out += _candidates(child, full + ".")
        else:
            out.append((full, child))
    return out


def with_cut_units(profile: ModelProfile, model: nn.Module) -> ModelProfile:
    """`profile` with the model's cut points (`cut_units`) when it lacks them and the model has
    a container child: a profile made before they were recorded would otherwise group a
    `ModuleList` as one layer, and a plan on it cut before the list, which the tracer cannot."""
    if "cut_units" in profile.meta or not any(isinstance(c, _CONTAINERS) for c in model.children()):
        return profile
    return dataclasses.replace(profile, meta={**profile.meta, "cut_units": [n for n, _ in _candidates(model)]})


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def forward_units(model: nn.Module, sample: torch.Tensor) -> list[Unit]:
    """The model's units in the order one forward of `sample` runs them (module docstring);
    units that never run are left out (they hold no step of the chain)."""
    calls: dict[str, list[int]] = {}
    order: list[str] = []
    handles = []
    for name, module in _candidates(model):
        def hook(_m, _inputs, output, name=name):
            if name not in calls:
                order.append(name)
            calls.setdefault(name, []).append(_tensor_bytes(output))
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(sample)
    finally:
        for h in handles:
            h.remove()
    twice = [n for n in order if len(calls[n]) > 1]
    if twice:
        raise CaramelError(f"pipeline: partition='auto' cuts between the modules a forward runs once, but "
                           f"{', '.join(twice)} run(s) more than once; name the modules that begin stages 1.. "
                           f"(partition='{order[1] if len(order) > 1 else 'name'}+...')")
    return [Unit(n, calls[n][0]) for n in order]


def unit_costs(profile: ModelProfile, model: nn.Module, units: list[Unit], sample: torch.Tensor) -> list[LayerCost]:
    """One `LayerCost` per unit: the profiled modules under it (the profile's batch scaled to
    `sample`'s), its output bytes and its parameters' bytes."""
    scale = sample.shape[0] / profile.batch_size
    modules = dict(model.named_modules())
    out = []
    for u in units:
        under = [m for m in profile.modules if m.name == u.name or m.name.startswith(u.name + ".")]
        params = sum(p.numel() * p.element_size() for p in modules[u.name].parameters())
        out.append(LayerCost(sum(m.forward_time_s for m in under) * scale,
                             sum(m.backward_time_s for m in under) * scale, u.output_bytes, params))
    return out


def traced_stages(model: nn.Module, boundaries: list[str], stages: int, sample: torch.Tensor
                  ) -> tuple[list[nn.Module], list[TiedWeight]]:
    """torch's tracer cuts `model` before each module named in `boundaries`; its stage modules
    keep the model's parameter names and the very same parameters (so the whole-model optimizer
    and state dict hold), a tied one included (`tied.share_tied`); also the tied parameters
    that end on more than one stage, whose gradients the pipeline sums over their holders."""
    from torch.distributed.pipelining import SplitPoint
    from torch.distributed.pipelining import pipeline as trace_pipeline

    names = dict(model.named_modules())
    missing = [b for b in boundaries if b not in names]
    if missing:
        raise CaramelError(f"pipeline: partition names {missing}, which the model does not have "
                           f"(its modules include {', '.join(list(names)[1:8])}, ...)")
    try:
        pipe = trace_pipeline(model, mb_args=(sample,), split_spec={b: SplitPoint.BEGINNING for b in boundaries})
    except Exception as e:  # noqa: BLE001 - torch.export's many failure types
        raise CaramelError(f"pipeline: torch.distributed.pipelining could not trace and split "
                           f"{type(model).__name__}: {type(e).__name__}: {e}") from None
    if pipe.num_stages != stages:
        raise CaramelError(f"pipeline: cutting at {boundaries} gave {pipe.num_stages} stages, not stages={stages}")
    out = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
    tied = share_tied(model, out)
    for stage in out:
        compiled_forward(stage)
    return out, tied


def compiled_forward(stage: nn.Module) -> None:
    """Run a traced stage's submodules through their generated code, not `torch.fx.Interpreter`.

    torch's splitter builds the stages from `InterpreterModule`s, which by default execute their
    graph node by node in Python: on CPU that made ResNet-18's stages 25-35% slower than the same
    layers run eagerly (docs/pipeline.md, "Traced stages"). The generated code runs the same graph
    with the same parameters, so the results are the same."""
    for module in stage.modules():
        if getattr(module, "_run_with_interpreter", False):
            module._run_with_interpreter = False
