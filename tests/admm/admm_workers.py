"""Workers and data of the dlADMM tests (spawned processes import this module)."""
from __future__ import annotations

import torch

from caramel.admm import AdmmOptions, DlAdmm, sharded_dladmm


def blobs(n: int = 90, features: int = 6, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters around random class centres: a small problem an MLP can fit."""
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(classes, features, generator=g, dtype=torch.float64)
    labels = torch.arange(n) % classes
    return centres[labels] + torch.randn(n, features, generator=g, dtype=torch.float64), labels


def options(solve: str, iterations: int = 6) -> AdmmOptions:
    return AdmmOptions(hidden=(8, 7), rho=1.0, nu=1.0, weight_decay=0.1, iterations=iterations, solve=solve, seed=3)


def serial_run(solve: str, iterations: int) -> DlAdmm:
    x, y = blobs()
    model = DlAdmm(x, y, 3, options(solve, iterations))
    for _ in range(iterations):
        model.iterate()
    return model


def sharded_worker(rank: int, world: int, iterations: int) -> dict:
    x, y = blobs()
    out = {}
    for solve in ("backtrack", "exact"):
        model = sharded_dladmm(x, y, 3, options(solve, iterations))
        for _ in range(iterations):
            model.iterate()
        # plain lists: tensors would travel as shared-memory handles that die with this process
        out[solve] = {"W": [w.tolist() for w in model.W], "b": [b.tolist() for b in model.b], "measures": model.measures(),
                      "theta": model.theta, "tau": model.tau}
    return out
