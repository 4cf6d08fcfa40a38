"""Caramel: computation/communication co-scheduling for data-parallel PyTorch training.

    import caramel
    caramel.init_distributed()
    model, optimizer = caramel.parallelize(model, optimizer)
    ...  # the usual loop: loss.backward(); optimizer.step(); optimizer.zero_grad()
    optimizer.synchronize()
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from caramel.errors import CaramelError, FormatError, MismatchError

if TYPE_CHECKING:
    import torch

    from caramel.distributed import DistInfo, init_distributed
    from caramel.profile.profiler import profile_model
    from caramel.runtime.model import CaramelModel
    from caramel.strategies.api import parallelize
    from caramel.strategies.api import shutdown
    from caramel.strategies.pipeline.runtime import pipeline

# torch-dependent names load on first use, so that `caramel simulate`/`plan` start fast
_LAZY = {
    "DistInfo": "caramel.distributed", "init_distributed": "caramel.distributed",
    "profile_model": "caramel.profile.profiler", "CaramelModel": "caramel.runtime.model", "parallelize": "caramel.strategies.api",
    "shutdown": "caramel.strategies.api", "pipeline": "caramel.strategies.pipeline.runtime",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'caramel' has no attribute {name!r}")

__version__ = "0.1.0"
__all__ = [
    "CaramelError", "CaramelModel", "DistInfo", "FormatError", "MismatchError", "clip_grad_norm_",
    "init_distributed", "parallelize", "pipeline", "profile_model", "shutdown", "simulate",
]


def clip_grad_norm_(optimizer: "torch.optim.Optimizer", max_norm: float, norm_type: float = 2.0) -> "torch.Tensor":
    """Clip the global norm of the *averaged* gradients, like `torch.nn.utils.clip_grad_norm_`.

    Call it between `loss.backward()` and `optimizer.step()`. It waits for every gradient of
    the step to be reduced (global-norm clipping needs all of them before any update), so that
    step gets no overlap with the next forward. Returns the total norm before clipping.
    `torch.nn.utils.clip_grad_norm_(model.parameters(), ...)` would see only this rank's local
    gradients: use this instead.
    """
    import torch

    engine = getattr(optimizer, "_caramel_engine", None)
    if engine is None:
        raise CaramelError("clip_grad_norm_ expects the optimizer returned by caramel.parallelize")
    if not engine.has_unapplied_reduction():
        raise CaramelError("clip_grad_norm_ must be called after loss.backward() and before optimizer.step()")
    engine.wait_reduced()
    grads = engine.reduced_grads()
    total = torch.nn.utils.get_total_norm(grads, norm_type)
    # the same arithmetic as torch.nn.utils.clip_grads_with_norm_
    clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(clip_coef.to(g.dtype))
    return total


def simulate(*args: Any, **kwargs: Any):
    """Predict step time from a profile, a cluster spec and a plan (see `caramel.sim.simulate`)."""
    from caramel.sim import simulate as _simulate
    return _simulate(*args, **kwargs)
