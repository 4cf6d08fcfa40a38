"""DDRL's feature hierarchy (Dong et al.): image statistics gathered layer by layer across
ranks, then a fixed nonlinear map from them to features; nothing here is trained by gradients.

Layer l cuts its input maps into patches, whitens them with the ZCA matrix of their merged
covariance, encodes each against a dictionary learned by distributed spherical k-means
(relu(<centroid, patch> - threshold)) and average-pools the result by 2. The next layer's
statistics are gathered on this layer's output, so the hierarchy is fitted bottom-up, one merge
per statistic. The features are every layer's output pooled to 2x2, standardized with merged
means and variances.

    extractor = DdrlExtractor.fit(images_of_this_rank, DdrlOptions(), total=allreduce)
    features = extractor(images)            # (batch, extractor.out_features)
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from caramel.ddrl.options import DdrlOptions
from caramel.ddrl.stats import Reducer, mean_var, moments, serial_total, spherical_kmeans, zca
from caramel.errors import CaramelError

FIT_BATCH = 512  # images per chunk while encoding the training shard (bounds memory)


class DdrlLayer(nn.Module):
    """Patch -> whiten -> encode -> pool, with the statistics as buffers (saved with the model)."""

    def __init__(self, channels: int, patch: int, pad: int, mean: torch.Tensor, whiten: torch.Tensor,
                 centroids: torch.Tensor, threshold: float):
        super().__init__()
        self.channels, self.patch, self.pad, self.threshold = channels, patch, pad, threshold
        self.register_buffer("mean", mean.float())
        self.register_buffer("whiten", whiten.float())
        self.register_buffer("centroids", centroids.float())

    @staticmethod
    def patches(maps: torch.Tensor, patch: int, pad: int) -> tuple[torch.Tensor, int, int]:
        """Rows of flattened patches (batch * positions, channels * patch^2) and the output size."""
        b, _, h, w = maps.shape
        cols = F.unfold(maps, patch, padding=pad)  # (batch, dim, positions)
        oh, ow = h + 2 * pad - patch + 1, w + 2 * pad - patch + 1
        return cols.transpose(1, 2).reshape(b * oh * ow, -1), oh, ow

    def encode(self, maps: torch.Tensor) -> torch.Tensor:
        rows, oh, ow = self.patches(maps, self.patch, self.pad)
        codes = torch.relu((rows - self.mean) @ self.whiten @ self.centroids.T - self.threshold)
        codes = codes.reshape(maps.shape[0], oh, ow, -1).permute(0, 3, 1, 2)
        return F.avg_pool2d(codes, 2, ceil_mode=True) if min(oh, ow) >= 2 else codes

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return self.encode(maps)


class DdrlExtractor(nn.Module):
    """The fitted hierarchy plus the feature standardization; maps images to feature vectors."""

    def __init__(self, layers: list[DdrlLayer], feat_mean: torch.Tensor, feat_std: torch.Tensor):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.register_buffer("feat_mean", feat_mean.float())
        self.register_buffer("feat_std", feat_std.float())
        self.out_features = len(feat_mean)

    def raw(self, images: torch.Tensor) -> torch.Tensor:
        parts, maps = [], images
        for layer in self.layers:
            maps = layer(maps)
            parts.append(F.adaptive_avg_pool2d(maps, 2).flatten(1))
        return torch.cat(parts, dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (self.raw(images) - self.feat_mean) / self.feat_std

    @classmethod
    def fit(cls, images: torch.Tensor, options: DdrlOptions | None = None, total: Reducer = serial_total) -> "DdrlExtractor":
        """Fit every layer on this rank's images (batch, channels, height, width), merging each
        statistic across ranks with `total`; every rank gets the same extractor."""
        o = options or DdrlOptions()
        if images.dim() != 4:
            raise CaramelError(f"DDRL: expected images as (batch, channels, height, width), got shape {tuple(images.shape)}")
        layers: list[DdrlLayer] = []
        maps = images.float()
        with torch.no_grad():
            for depth, (patch, k) in enumerate(zip(o.patches, o.centroids)):
                pad = patch // 2 if depth == 0 else 0
                if maps.shape[2] + 2 * pad < patch or maps.shape[3] + 2 * pad < patch:
                    raise CaramelError(f"DDRL layer {depth + 1}: {patch}x{patch} patches do not fit its "
                                       f"{maps.shape[2]}x{maps.shape[3]} input maps; use fewer layers or smaller patches")
                rows, _, _ = DdrlLayer.patches(maps, patch, pad)
                mean, cov, _ = moments(rows, total)
                whiten = zca(cov, o.whiten_eps)
                centroids = spherical_kmeans((rows.double() - mean) @ whiten, k, o.kmeans_iterations, o.seed + depth, total)
                layer = DdrlLayer(maps.shape[1], patch, pad, mean, whiten, centroids, o.threshold)
                layers.append(layer)
                maps = torch.cat([layer(c) for c in maps.split(FIT_BATCH)])
            probe = cls(layers, torch.zeros(1), torch.ones(1))
            feats = torch.cat([probe.raw(c) for c in images.float().split(FIT_BATCH)])
            mean, var = mean_var(feats, total)  # per feature only: a 768 x 768 covariance would be 4.7 MB to merge
            std = var.sqrt() + 1e-3
        return cls(layers, mean, std)
