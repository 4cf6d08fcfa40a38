"""Data and workers of the DDRL tests (spawned processes import this module)."""
from __future__ import annotations

import torch

from caramel.ddrl import DdrlOptions
from caramel.ddrl.model import fit_distributed

OPTIONS = DdrlOptions(centroids=(16, 24), kmeans_iterations=4)


def digits(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n of scikit-learn's digits as (n, 1, 8, 8) images in [0, 1] and labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.images[:n], dtype=torch.float32).unsqueeze(1) / 16.0, torch.tensor(d.target[:n])


def fit_worker(rank: int, world: int, images: list) -> dict:
    """Images arrive as nested lists from the parent: no scikit-learn import in the workers."""
    images = torch.tensor(images, dtype=torch.float32)
    extractor, info = fit_distributed(images, OPTIONS)
    # plain lists: tensors would travel as shared-memory handles that die with this process
    return {"buffers": {k: v.tolist() for k, v in extractor.state_dict().items()}, "info": info}
