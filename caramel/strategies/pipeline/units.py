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


def traced_stages(model: nn.Module, boundaries: list[str], stages: int, sample: torch.Tensor) -> list[nn.Module]:
    """torch's tracer cuts `model` before each module named in `boundaries`; its stage modules
    keep the model's parameter names and the very same parameters (so the whole-model optimizer
    and state dict hold)."""
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
    _require_own_parameters(model, out, boundaries)
    for stage in out:
        compiled_forward(stage)
    return out


def _require_own_parameters(model: nn.Module, stages: list[nn.Module], boundaries: list[str]) -> None:
    """Every stage parameter must be one of the model's own: the optimizer holds those. torch's
    splitter gives a tied parameter (one Parameter used by modules on different stages) a new
    copy on each stage that uses it; the copies get gradients the optimizer never sees and the
    model's own Parameter none, so the tied weight would silently stay frozen."""
    own = {id(p) for p in model.parameters()}
    foreign = sorted({n for s in stages for n, p in s.named_parameters(remove_duplicate=False) if id(p) not in own})
    if not foreign:
        return
    aliases: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    tied = [names for names in aliases.values() if len(names) > 1 and any(n in foreign for n in names)]
    what = ("; ".join(" = ".join(names) for names in tied) if tied else ", ".join(foreign))
    raise CaramelError(f"pipeline: the model ties parameters ({what}) whose uses the cut at {boundaries} puts on "
                       f"different stages: torch's tracer gives each stage its own copy, which the optimizer "
                       f"never updates, so the tied weight would train frozen. Untie them (e.g. "
                       f"`model.head.weight = nn.Parameter(model.tok.weight.detach().clone())`) or cut so that "
                       f"every use of a tied parameter is on one stage")


def compiled_forward(stage: nn.Module) -> None:
    """Run a traced stage's submodules through their generated code, not `torch.fx.Interpreter`.

    torch's splitter builds the stages from `InterpreterModule`s, which by default execute their
    graph node by node in Python: on CPU that made ResNet-18's stages 25-35% slower than the same
    layers run eagerly (docs/pipeline.md, "Traced stages"). The generated code runs the same graph
    with the same parameters, so the results are the same."""
    for module in stage.modules():
        if getattr(module, "_run_with_interpreter", False):
            module._run_with_interpreter = False
