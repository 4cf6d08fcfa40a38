"""An emulated slow worker: a calibrated delay after every training forward.

To study uneven workers on one host, a rank's compute is made FACTOR times slower without a
CPU quota: time the model's forward and backward per sample on that rank (alone, no
communication, no update), then sleep (FACTOR - 1) times that per sample of the local batch
after every training forward. The delay scales with the local batch, so a worker given fewer
samples (`balance="batch"`) is slowed by less, as a slower CPU would be; the sleep holds no
lock, so communication threads keep running. A model that drops units (`balance="dropout"`)
registers its compute against the full model's (from its measured table) with
`set_compute_ratio`; the delay is scaled by it, as a slower CPU would run the narrower model.
The registry is weak and off the model, so a copy or pickle of the model carries no balancer. Used by `caramel bench --slow-worker` and
`caramel train --slow-worker`.
"""
from __future__ import annotations

import copy
import inspect
import math
import time
import weakref
from typing import Callable

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.stats import median

CALIBRATION_STEPS = 3
_COMPUTE_RATIOS: "weakref.WeakKeyDictionary[nn.Module, Callable[[], Callable[[], float] | None]]" = weakref.WeakKeyDictionary()


def set_compute_ratio(model: nn.Module, ratio: Callable[[], float]) -> None:
    """`ratio()`: `model`'s compute now against its full compute, read by `slow_down`'s delay.
    A bound method is held weakly too (its owner often holds the model: no cycle kept alive)."""
    _COMPUTE_RATIOS[model] = weakref.WeakMethod(ratio) if inspect.ismethod(ratio) else (lambda: ratio)


def _compute_ratio(model: nn.Module) -> float:
    ratio = _COMPUTE_RATIOS.get(model)
    fn = ratio() if ratio is not None else None
    return fn() if fn is not None else 1.0


def per_sample_compute_s(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn) -> float:
    """Median seconds of forward + backward per sample, on a copy (no communication, no update)."""
    m = copy.deepcopy(model)
    times = []
    for _ in range(CALIBRATION_STEPS + 1):
        t0 = time.perf_counter()
        loss_fn(m(inputs), targets).backward()
        times.append(time.perf_counter() - t0)
    return median(times[1:]) / max(int(inputs.shape[0]), 1)


def slow_down(model: nn.Module, delay_per_sample_s: float) -> None:
    """After every training forward of `model`, sleep `delay_per_sample_s` per sample of its input."""
    def hook(m, args, _out):
        if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            time.sleep(delay_per_sample_s * int(args[0].shape[0]) * _compute_ratio(m))
    model.register_forward_hook(hook)


def parse_slow_worker(text: str, what: str = "--slow-worker") -> tuple[int, float]:
    """`RANK:FACTOR` (or `RANK=FACTOR`) -> (rank, factor); one clear error otherwise."""
    rank, sep, factor = str(text).replace("=", ":").partition(":")
    try:
        out = (int(rank), float(factor)) if sep else None
    except ValueError:
        out = None
    if out is None or out[0] < 0 or not (math.isfinite(out[1]) and out[1] >= 1):
        raise CaramelError(f"{what} {text!r}: expected RANK:FACTOR with a rank >= 0 and a factor >= 1, e.g. 1:2 "
                           "(rank 1 computes 2x slower)")
    return out
