"""DDRL's knobs: the feature hierarchy (patch sizes, dictionary sizes) and its statistics.

    DdrlOptions(centroids=(64, 128), kmeans_iterations=10)
"""
from __future__ import annotations

from dataclasses import dataclass

from caramel.errors import CaramelError


@dataclass(frozen=True)
class DdrlOptions:
    """`patches`: square patch width of each layer (layer 1 pads to keep the map size; later
    layers do not). `centroids`: dictionary size of each layer (the number of feature maps it
    outputs). `kmeans_iterations`: passes of spherical k-means per layer, each one merge of
    per-rank sums. `whiten_eps`: added to the patch covariance's eigenvalues before ZCA
    whitening (larger: less noise amplified). `threshold`: the encoder's soft threshold,
    relu(<centroid, patch> - threshold). `seed`: the centroids' initial draw (the same on
    every rank, so the dictionary does not depend on how the data is split)."""

    patches: tuple[int, ...] = (3, 2)
    centroids: tuple[int, ...] = (64, 128)
    kmeans_iterations: int = 10
    whiten_eps: float = 0.1
    threshold: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.patches) != len(self.centroids) or not self.patches:
            raise CaramelError(f"patches and centroids need one entry per layer (at least one), got "
                               f"{self.patches!r} and {self.centroids!r}")
        if any(p < 1 for p in self.patches) or any(k < 1 for k in self.centroids):
            raise CaramelError(f"patch widths and centroid counts must be >= 1, got {self.patches!r} and {self.centroids!r}")
        if self.kmeans_iterations < 1:
            raise CaramelError(f"kmeans_iterations must be >= 1, got {self.kmeans_iterations}")
        if not self.whiten_eps > 0 or self.threshold < 0:
            raise CaramelError(f"whiten_eps must be > 0 and threshold >= 0, got {self.whiten_eps} and {self.threshold}")
