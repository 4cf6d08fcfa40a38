"""The statistics DDRL merges across ranks: moments of patches, and spherical k-means sums.

Each function computes sums over this rank's samples and passes them through `total` (a sum
over ranks; the identity on one process), the map and reduce of the paper's MapReduce jobs.
Sums are float64 so that the merged statistics do not depend on how the data was split,
beyond rounding.
"""
from __future__ import annotations

from typing import Callable

import torch

Reducer = Callable[[torch.Tensor], torch.Tensor]


def serial_total(t: torch.Tensor) -> torch.Tensor:
    return t


def moments(x: torch.Tensor, total: Reducer) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mean and covariance of the rows of x over every rank, from one merge of (count, sum,
    sum of outer products)."""
    x = x.double()
    dim = x.shape[1]
    packed = total(torch.cat([torch.tensor([float(len(x))], dtype=torch.float64), x.sum(0), (x.T @ x).reshape(-1)]))
    n = int(packed[0])
    mean = packed[1:1 + dim] / n
    cov = packed[1 + dim:].reshape(dim, dim) / n - torch.outer(mean, mean)
    return mean, cov, n


def mean_var(x: torch.Tensor, total: Reducer) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of each column of x over every rank (one merge of count, sum, sum of squares)."""
    x = x.double()
    packed = total(torch.cat([torch.tensor([float(len(x))], dtype=torch.float64), x.sum(0), (x * x).sum(0)]))
    dim = x.shape[1]
    n = packed[0]
    mean = packed[1:1 + dim] / n
    return mean, (packed[1 + dim:] / n - mean * mean).clamp(min=0.0)


def zca(cov: torch.Tensor, eps: float) -> torch.Tensor:
    """The ZCA whitening matrix V (L + eps)^-1/2 V^T of a covariance."""
    vals, vecs = torch.linalg.eigh(cov)
    return (vecs * (vals.clamp(min=0.0) + eps).rsqrt()) @ vecs.T


def spherical_kmeans(x: torch.Tensor, k: int, iterations: int, seed: int, total: Reducer) -> torch.Tensor:
    """k unit-norm centroids (k x dim) of the rows of x by spherical k-means (Coates and Ng): each
    row is assigned to the centroid with the largest |<c, x>| and adds <c, x> x to it; the
    sums are merged across ranks, the old centroid added (so an empty cluster keeps its place)
    and the result normalized. Initial centroids are drawn from `seed`, the same everywhere."""
    x = x.double()
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(k, x.shape[1], generator=g, dtype=torch.float64)
    d = d / d.norm(dim=1, keepdim=True).clamp(min=1e-12)
    for _ in range(iterations):
        s = x @ d.T
        best = s.abs().argmax(dim=1)
        weight = torch.zeros_like(s).scatter_(1, best.unsqueeze(1), s.gather(1, best.unsqueeze(1)))
        d = total(weight.T @ x) + d
        d = d / d.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return d
