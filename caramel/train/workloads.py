"""Built-in training workloads, one registry: `WORKLOADS[name](cfg) -> TrainWorkload`.

A workload is a model, its train/validation datasets, a loss, and a way to count correct
predictions, so the loop can report validation loss and accuracy for any of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from caramel.models.zoo import GPT, lm_loss
from caramel.train.config import TrainConfig
from caramel.train.data import char_datasets, digits_datasets


@dataclass
class TrainWorkload:
    name: str
    model: nn.Module
    train_set: object  # a dataset with __len__ and batch(indices) -> (inputs, targets)
    val_set: object
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    sample_unit: str  # what one sample is, for the banner ("sequences of 64 bytes", "images")
    tokens_per_sample: int  # predictions per sample (accuracy and loss are averaged over these)
    info: dict[str, Any] = field(default_factory=dict)  # what building it measured (goes into the summary)

    def correct(self, logits: torch.Tensor, targets: torch.Tensor) -> int:
        """Number of correct top-1 predictions (per token for language models)."""
        return int((logits.argmax(dim=-1) == targets).sum())


WORKLOADS: dict[str, Callable[[TrainConfig], TrainWorkload]] = {}


def register(name: str):
    def deco(fn):
        assert name not in WORKLOADS, f"workload {name} registered twice"
        WORKLOADS[name] = fn
        return fn
    return deco


@register("char_gpt")
def char_gpt(cfg: TrainConfig) -> TrainWorkload:
    """Byte-level GPT (tied embeddings) on the standard library's source code."""
    train, val = char_datasets(cfg.data.text_bytes, cfg.data.seq_len, cfg.data.val_fraction)
    m = cfg.model
    model = GPT(vocab=256, d=m.d_model, layers=m.layers, heads=m.heads, seq=cfg.data.seq_len, dropout=m.dropout)
    return TrainWorkload("char_gpt", model, train, val, lm_loss, f"sequences of {cfg.data.seq_len} bytes", cfg.data.seq_len)


class DigitsNet(nn.Module):
    """A small CNN for 8x8 grey images: two convolutions, then `layers` hidden linear layers."""

    def __init__(self, hidden: int, layers: int, dropout: float, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        dims = [32 * 4 * 4] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(x, 1)
        for layer in self.hidden:
            x = self.drop(F.relu(layer(x)))
        return self.head(x)


@register("digits")
def digits(cfg: TrainConfig) -> TrainWorkload:
    """Image classification on scikit-learn's digits (ships inside scikit-learn; no download)."""
    train, val = digits_datasets(cfg.data.val_fraction)
    model = DigitsNet(cfg.model.d_model, cfg.model.layers, cfg.model.dropout)
    return TrainWorkload("digits", model, train, val, F.cross_entropy, "8x8 images", 1)


@register("ddrl")
def ddrl(cfg: TrainConfig) -> TrainWorkload:
    """DDRL on the digits: a feature hierarchy fitted from statistics that every rank gathers on
    its part of the training images and merges (caramel.ddrl), then a small MLP head, the only
    trained part, trained data-parallel by the loop like any model."""
    from caramel.ddrl.model import DdrlNet, fit_distributed

    train, val = digits_datasets(cfg.data.val_fraction)
    extractor, info = fit_distributed(train.inputs)
    model = DdrlNet(extractor, cfg.model.d_model, cfg.model.layers, cfg.model.dropout)
    return TrainWorkload("ddrl", model, train, val, F.cross_entropy, "8x8 images", 1, info)


def build_workload(cfg: TrainConfig) -> TrainWorkload:
    """The configured workload, with the model initialized from `cfg.run.seed` (identical on every rank)."""
    torch.manual_seed(cfg.run.seed)
    return WORKLOADS[cfg.run.workload](cfg)
