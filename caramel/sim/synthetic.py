"""Synthetic profiles for tests, what-ifs and the scale benchmark, without running a model.

`synthetic_profile` builds a chain of layers (one module and one parameter each, forward in
index order, backward in reverse); `resnet50_profile` has ResNet-50's 161 parameters with their
real shapes (25.6 M float32 values) and compute split by each layer's FLOPs.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def synthetic_profile(n_params: int | None = None, sizes_bytes: Sequence[int] | None = None,
                      times_s: Sequence[float] | None = None, *, forward_time_s: float = 0.03,
                      backward_time_s: float = 0.06, optimizer_time_s: float = 0.005,
                      name: str = "synthetic", dtype: str = "float32") -> ModelProfile:
    """A chain of layers, one parameter each: layer i's weight has `sizes_bytes[i]` bytes.

    `times_s[i]` is layer i's share of compute (normalized; default proportional to its size);
    forward and backward time are split by it, backward running the chain in reverse.
    """
    if sizes_bytes is None:
        if n_params is None or n_params < 1:
            raise CaramelError(f"n_params must be a positive integer when sizes_bytes is not given, got {n_params!r}")
        sizes_bytes = [4096 * (1 + (i * 7919) % 64) for i in range(n_params)]
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or any(s <= 0 for s in sizes):
        raise CaramelError("sizes_bytes must list at least one positive size")
    if dtype not in DTYPE_BYTES:
        raise CaramelError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    weights = [float(t) for t in times_s] if times_s is not None else [float(s) for s in sizes]
    if len(weights) != len(sizes) or any(w < 0 for w in weights):
        raise CaramelError(f"times_s must give a share >= 0 per parameter ({len(sizes)} of them)")
    layers = [(f"layer{i}", "Linear", [(f"layer{i}.weight", s)]) for i, s in enumerate(sizes)]
    return _chain_profile(name, layers, weights, forward_time_s, backward_time_s, optimizer_time_s, dtype)


SPLIT_TYPES = ("Linear", "Conv1d", "Conv2d", "Embedding")


def with_split_backward(profile: ModelProfile, weight_share: float = 0.5, activation_bytes: int = 64 * 1024,
                        splittable: Sequence[str] | None = None) -> ModelProfile:
    """`profile` as `profile_model` would measure its split backward: every module of a splittable
    type (or named in `splittable`) gets `weight_share` of its backward as its weight gradient,
    the rest as its input gradient, and `deferred_bytes` of twice `activation_bytes` (its input
    and output gradient); every module's `input_bytes` is `activation_bytes`."""
    if not 0 <= weight_share <= 1:
        raise CaramelError(f"weight_share must be between 0 and 1, got {weight_share!r}")
    names = set(splittable) if splittable is not None else {m.name for m in profile.modules if m.type in SPLIT_TYPES}
    modules = []
    for m in profile.modules:
        if m.name in names:
            modules.append(dataclasses.replace(
                m, splittable=True, input_grad_time_s=m.backward_time_s * (1 - weight_share),
                weight_grad_time_s=m.backward_time_s * weight_share, deferred_bytes=2 * activation_bytes,
                input_bytes=activation_bytes))
        else:
            modules.append(dataclasses.replace(m, input_bytes=activation_bytes))
    return dataclasses.replace(profile, modules=modules)


def resnet50_profile(forward_time_s: float = 0.08, backward_time_s: float = 0.16,
                     optimizer_time_s: float = 0.01, batch_size: int = 32) -> ModelProfile:
    """ResNet-50 (torchvision layout, 224x224 input): real parameter shapes, compute split by FLOPs."""
    layers: list[tuple[str, str, list[tuple[str, int]]]] = []
    flops: list[float] = []

    def conv(name: str, cout: int, cin: int, k: int, hw: int) -> None:
        layers.append((name, "Conv2d", [(f"{name}.weight", cout * cin * k * k * 4)]))
        flops.append(2.0 * cout * cin * k * k * hw * hw)

    def bn(name: str, c: int, hw: int) -> None:
        layers.append((name, "BatchNorm2d", [(f"{name}.weight", c * 4), (f"{name}.bias", c * 4)]))
        flops.append(8.0 * c * hw * hw)

    conv("conv1", 64, 3, 7, 112)
    bn("bn1", 64, 112)
    inplanes = 64
    for li, (planes, blocks, hw) in enumerate([(64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7)], start=1):
        for bi in range(blocks):
            p = f"layer{li}.{bi}"
            conv(f"{p}.conv1", planes, inplanes, 1, hw if bi or li == 1 else hw * 2)
            bn(f"{p}.bn1", planes, hw)
            conv(f"{p}.conv2", planes, planes, 3, hw)
            bn(f"{p}.bn2", planes, hw)
            conv(f"{p}.conv3", planes * 4, planes, 1, hw)
            bn(f"{p}.bn3", planes * 4, hw)
            if bi == 0:
                conv(f"{p}.downsample.0", planes * 4, inplanes, 1, hw)
                bn(f"{p}.downsample.1", planes * 4, hw)
            inplanes = planes * 4
    layers.append(("fc", "Linear", [("fc.weight", 1000 * 2048 * 4), ("fc.bias", 1000 * 4)]))
    flops.append(2.0 * 1000 * 2048)
    prof = _chain_profile("resnet50", layers, flops, forward_time_s, backward_time_s, optimizer_time_s, "float32")
    prof.batch_size = batch_size
    return prof


def _chain_profile(name: str, layers: list[tuple[str, str, list[tuple[str, int]]]], weights: list[float],
                   forward_time_s: float, backward_time_s: float, optimizer_time_s: float, dtype: str) -> ModelProfile:
    for label, v in (("forward_time_s", forward_time_s), ("backward_time_s", backward_time_s), ("optimizer_time_s", optimizer_time_s)):
        if not v >= 0:
            raise CaramelError(f"{label} must be >= 0, got {v!r}")
    total_w = sum(weights) or 1.0
    fwd = [forward_time_s * w / total_w for w in weights]
    bwd = [backward_time_s * w / total_w for w in weights]
    elem = DTYPE_BYTES[dtype]
    params: list[ParamInfo] = []
    modules: list[ModuleInfo] = []
    n_params = sum(len(ps) for _, _, ps in layers)
    start = 0.0
    # backward runs the layers in reverse: layer i's gradients are ready once layers i.. are done
    bwd_done_after = [0.0] * len(layers)
    acc = 0.0
    for i in reversed(range(len(layers))):
        acc += bwd[i]
        bwd_done_after[i] = acc
    for li, (mname, mtype, plist) in enumerate(layers):
        idxs = []
        for pname, nbytes in plist:
            numel = max(nbytes // elem, 1)
            idx = len(params)
            params.append(ParamInfo(index=idx, name=pname, shape=[numel], dtype=dtype, numel=numel, bytes=numel * elem,
                                    requires_grad=True, ready_order=n_params - 1 - idx, ready_time_s=bwd_done_after[li],
                                    first_use_order=li, first_use_time_s=start, use_modules=[mname]))
            idxs.append(idx)
        modules.append(ModuleInfo(name=mname, type=mtype, forward_start_s=start, forward_time_s=fwd[li],
                                  backward_time_s=bwd[li], params=idxs))
        start += fwd[li]
    return ModelProfile(model=name, batch_size=1, forward_time_s=forward_time_s, backward_time_s=backward_time_s,
                        optimizer_time_s=optimizer_time_s, params=params, modules=modules, meta={"synthetic": True})
