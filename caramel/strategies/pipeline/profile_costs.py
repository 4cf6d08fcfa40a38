"""The pipeline simulator's inputs from a model profile: each top-level layer's cost, where a
pipeline can cut, and the weights tied across layers (what every stage holding one reduces,
and the sum of its gradient over the stages' positions, `tied.py`).

Only trainable parameters are priced: both replica reducers (Caramel's engine and DDP) skip a
parameter with `requires_grad=False`, and a frozen tied weight has no gradient to sum."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.pipeline.planner import LayerCost, ScalingCost, fit_scaling
from caramel.strategies.pipeline.timeline import StageCosts
from caramel.topology.spec import ClusterSpec


def scaling_from_profile(profile: ModelProfile) -> tuple[list[str], list[ScalingCost]]:
    """Each top-level layer's cost at any microbatch size, from the profile alone: the profiled
    modules grouped by their first name component (by the children of a top-level `ModuleList`
    or `ModuleDict` where the profile names them, `cut_units`: where a pipeline can cut), a
    layer's output the next layer's measured input, its trainable parameters' bytes (a tied one
    on the layer that owns it; `with_held_bytes` adds it to the other stages holding it). With
    module times at a second batch size (`small_batch_size`) each layer's time is the line
    through both (`fit_scaling`: a fixed cost per call plus per sample); without, times are
    proportional to the samples (no fixed cost)."""
    names: list[str] = []
    groups: dict[str, list] = {}
    for m in profile.modules:
        top = layer_of(profile, m.name)
        if top not in groups:
            names.append(top)
            groups[top] = []
        groups[top].append(m)
    pbytes = {p.index: p.bytes if p.requires_grad else 0 for p in profile.params}
    b = profile.batch_size
    small = profile.small_batch_size
    out = []
    for k, name in enumerate(names):
        mods = groups[name]
        nxt = groups[names[k + 1]][0].input_bytes if k + 1 < len(names) else 0
        large = LayerCost(sum(m.forward_time_s for m in mods), sum(m.backward_time_s for m in mods), int(nxt or 0),
                          sum(pbytes[i] for m in mods for i in m.params))
        measured = small is not None and all(m.small_batch_forward_time_s is not None
                                             and m.small_batch_backward_time_s is not None for m in mods)
        if measured:
            at_small = LayerCost(sum(m.small_batch_forward_time_s for m in mods),
                                 sum(m.small_batch_backward_time_s for m in mods), 0, large.param_bytes)
            (fit,) = fit_scaling([at_small], small, [large], b)
        else:
            fit = ScalingCost(0.0, large.forward_s / b, 0.0, large.backward_s / b, large.output_bytes / b, large.param_bytes)
        out.append(fit)
    return names, out


def layer_of(profile: ModelProfile, module: str) -> str:
    """The top-level layer (`scaling_from_profile`'s grouping) a profiled module belongs to."""
    units = profile.meta.get("cut_units") or []
    return next((u for u in units if module == u or module.startswith(u + ".")), module.split(".")[0])


def shares_a_weight(profile: ModelProfile) -> bool:
    """Whether the profile saw a parameter used by two or more of its layers: a cut may split
    that tied weight across stages, which the runtime trains with equal replica counts only."""
    return any(len({layer_of(profile, m) for m in p.use_modules}) > 1 for p in profile.params)


@dataclass(frozen=True)
class TiedWeight:
    """A trainable parameter used by two or more top-level layers: their indices, the owner
    (whose `scaling_from_profile` bytes hold it) first, and its bytes."""

    layers: tuple[int, ...]
    nbytes: int


def tied_weights(profile: ModelProfile, names: list[str]) -> list[TiedWeight]:
    """The profile's trainable tied weights over its top-level layers `names`."""
    index = {n: k for k, n in enumerate(names)}
    owner = {i: index.get(layer_of(profile, m.name)) for m in profile.modules for i in m.params}
    out = []
    for p in profile.params:
        users = {index[u] for u in (layer_of(profile, m) for m in p.use_modules) if u in index}
        first = owner.get(p.index)
        if p.requires_grad and len(users | {first} - {None}) > 1:
            head = first if first is not None else min(users)
            out.append(TiedWeight((head, *sorted(users - {head})), p.bytes))
    return out


def stage_of_layers(boundaries: list[int], layers: int) -> list[int]:
    """The stage of every layer for a cut before each of `boundaries`."""
    return [sum(1 for b in boundaries if b <= k) for k in range(layers)]


def with_held_bytes(costs: list[LayerCost], ties: list[TiedWeight], boundaries: list[int]) -> list[LayerCost]:
    """`costs` with each tied weight's bytes also on the first layer using it of every other
    stage: that stage holds the same Parameter (`tied.share_tied`) and its replicas reduce it."""
    stage = stage_of_layers(boundaries, len(costs))
    extra = [0] * len(costs)
    for t in ties:
        seen = {stage[t.layers[0]]}
        for k in sorted(t.layers[1:]):
            if stage[k] not in seen:
                seen.add(stage[k])
                extra[k] += t.nbytes
    return [dataclasses.replace(c, param_bytes=c.param_bytes + e) if e else c for c, e in zip(costs, extra)]


def tied_allreduce_s(ties: list[TiedWeight], boundaries: list[int], layers: int, positions: int,
                     cluster: ClusterSpec) -> list[float]:
    """Per stage: the sum of the gradients of the tied weights it holds with the other
    positions holding them (`tied.TiedGrads`, its bytes at the link rate); 0 where a tied
    weight's uses are all on one position."""
    stage = stage_of_layers(boundaries, layers)
    out = [0.0] * (len(boundaries) + 1)
    for t in ties:
        stages = {stage[k] for k in t.layers}
        held = {s % positions for s in stages}
        if len(held) > 1:
            ring = ClusterSpec.uniform(len(held), cluster.bandwidth_bps, cluster.latency_s)
            for s in stages:
                out[s] += ring.allreduce_time_s(t.nbytes)
    return out


def with_tied(sc: StageCosts, tied_s: list[float], mode: str) -> StageCosts:
    """`sc` with each stage's tied-weight sum: after the replicas' all-reduce (mode "after"),
    or, where that reduction overlaps the pipeline, after the schedule and before the update
    (DDP's backward returns reduced; `runtime.Pipeline.step` then sums the tied weights)."""
    if not any(tied_s):
        return sc
    sc = dataclasses.replace(sc, allreduce_s=[a + t for a, t in zip(sc.allreduce_s or [0.0] * len(tied_s), tied_s)])
    if mode != "after":
        sc = dataclasses.replace(sc, update_s=[u + t for u, t in zip(sc.update_s, tied_s)])
    return sc


def costs_from_profile(profile: ModelProfile, microbatches: int, batches: int = 1) -> tuple[list[str], list[LayerCost]]:
    """Per-microbatch `LayerCost`s of the model's top-level layers (`scaling_from_profile`), a
    step's batch `batches` times the profile's cut into `microbatches`."""
    names, layers = scaling_from_profile(profile)
    samples = profile.batch_size * batches / microbatches
    return names, [layer.at(samples) for layer in layers]


def profiled_cuts(names: list[str], cuts: list[int] | list[str]) -> list[int]:
    """An explicit partition on the profile's top-level layers: a layer index (`nn.Sequential`)
    cuts before the first profiled layer at or after it; a module name (a traced model) before
    the top-level module of that name."""
    index = [int(n) if n.isdigit() else k for k, n in enumerate(names)]
    out = []
    for c in cuts:
        if isinstance(c, str):
            if c not in names:
                raise CaramelError(f"partition {c!r}: the simulator cuts before the profile's top-level modules "
                                   f"{names}; name one of them")
            out.append(names.index(c))
        else:
            out.append(next(k for k, i in enumerate(index) if i >= c))
    return out
