"""Lazy updates: the user's own optimizer applied to some buckets' parameters only.

The optimizer's `param_groups` are narrowed to those parameters, each parameter's `.grad` is
pointed at its averaged gradient in the bucket (None where no rank used it, as DDP leaves it),
and the hyper-parameters are those of the step that produced the gradients (a scheduler may
have changed them since). Everything is put back afterwards, also on an error. Exact for the
optimizers whose update of a parameter depends only on that parameter
(`caramel.runtime.optimizer.PER_PARAMETER_OPTIMIZERS`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from caramel.runtime.buckets import FlatBucket


def group_subsets(optimizer: torch.optim.Optimizer, buckets: list[FlatBucket]) -> dict[int, list[list[nn.Parameter]]]:
    """Per bucket id: its parameters in each of the optimizer's param groups, in group order."""
    out = {}
    for fb in buckets:
        ids = {id(p) for p in fb.params}
        out[fb.id] = [[p for p in g["params"] if id(p) in ids] for g in optimizer.param_groups]
    return out


def snapshot_hparams(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The hyper-parameters of every param group now (tensors cloned), for a later `apply_buckets`."""
    return [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups]


def apply_buckets(optimizer: Any, buckets: list[FlatBucket], subsets: dict[int, list[list[nn.Parameter]]],
                  bucket_ids: list[int], hparams: list[dict[str, Any]] | None) -> None:
    """One call of the optimizer's own step on these buckets' parameters (module docstring)."""
    groups = optimizer.param_groups
    saved_params = [g["params"] for g in groups]
    saved_hp: list[dict[str, Any]] = []
    swapped: list[tuple[nn.Parameter, torch.Tensor | None]] = []
    try:
        if hparams is not None:
            for g, snap in zip(groups, hparams):
                cur = {k: g[k] for k in snap if g.get(k) is not snap[k]}
                saved_hp.append(cur)
                for k in cur:
                    g[k] = snap[k]
        narrowed = [[] for _ in groups]
        for b in bucket_ids:
            fb = buckets[b]
            used = fb.used()
            for j, p in enumerate(fb.params):
                swapped.append((p, p.grad))
                p.grad = fb.grad_view(j) if used[j] else None
            for k, sub in enumerate(subsets[b]):
                narrowed[k].extend(sub)
        for g, sub in zip(groups, narrowed):
            g["params"] = sub
        optimizer._caramel_inner_step()
    finally:
        for g, params in zip(groups, saved_params):
            g["params"] = params
        for g, cur in zip(groups, saved_hp):
            g.update(cur)
        for p, grad in swapped:
            p.grad = grad
