"""The DDRL network: the fitted, frozen extractor, then a small MLP head (the only parameters).

`fit_distributed` is what every rank of a `caramel train --workload ddrl` job calls: it fits
the extractor on this rank's part of the training images, merging statistics over the default
process group, and times it.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.ddrl.extractor import DdrlExtractor
from caramel.ddrl.options import DdrlOptions
from caramel.ddrl.stats import Reducer


def allreduce_total(group: dist.ProcessGroup | None = None) -> Reducer:
    """Sum a tensor over the ranks of `group` (float64 on the wire)."""
    def total(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().to(torch.float64).clone()
        dist.all_reduce(out, group=group)
        return out.to(t.dtype)
    return total


class DdrlNet(nn.Module):
    """The extractor, then `layers` hidden ReLU layers of `hidden` units and a linear output.

    The extractor is held outside the module tree on purpose: it is the same on every rank by
    construction and never changes, so it must not travel with the buffers that data-parallel
    strategies broadcast every step (about 0.5 MB here), nor fill checkpoints; a resumed job
    refits it from the same data and seed. It follows the input's device."""

    def __init__(self, extractor: DdrlExtractor, hidden: int, layers: int, dropout: float, classes: int = 10):
        super().__init__()
        object.__setattr__(self, "extractor", extractor)  # not a submodule: see the class docstring
        dims = [extractor.out_features] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.ReLU(), nn.Dropout(dropout)]
        self.head = nn.Sequential(*blocks, nn.Linear(dims[-1], classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.extractor.feat_mean.device != images.device:
            self.extractor.to(images.device)
        with torch.no_grad():
            features = self.extractor(images)
        return self.head(features)


def fit_distributed(train_images: torch.Tensor, options: DdrlOptions | None = None) -> tuple[DdrlExtractor, dict]:
    """Every rank fits on its strided share of `train_images` (rank r takes r, r + W, ...) and
    merges over the default group (or fits alone without one). Returns the extractor and
    {"ddrl_fit_s", "ddrl_fit_images_per_rank", "ddrl_features"}."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        total = allreduce_total()
        dist.barrier()  # time the fit alone, not the ranks' start-up skew
    else:
        rank, world, total = 0, 1, (lambda t: t)
    mine = train_images[rank::world]
    t0 = time.perf_counter()
    extractor = DdrlExtractor.fit(mine, options, total)
    fit_s = time.perf_counter() - t0
    return extractor, {"ddrl_fit_s": fit_s, "ddrl_fit_images_per_rank": len(mine), "ddrl_features": extractor.out_features}
