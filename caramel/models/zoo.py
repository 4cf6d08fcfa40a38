"""Model zoo: real shapes for benches, demos and parity tests.

Each entry is a factory `f(batch_size: int, seed: int) -> ModelBatch` registered in `MODELS`.
A `ModelBatch` bundles the model, one synthetic batch (inputs, targets) and the loss function,
with `loss_fn(model(inputs), targets)` the loss of one worker's batch. A user model plugs in
with `path/to/file.py:factory`, where `factory()` returns `(model, (inputs, targets), loss_fn)`.
"""
from __future__ import annotations

import importlib.util

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from caramel.errors import CaramelError


@dataclass
class ModelBatch:
    name: str
    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


MODELS: dict[str, Callable[..., ModelBatch]] = {}


def register(name: str):
    def deco(fn):
        assert name not in MODELS, f"model {name} registered twice"
        MODELS[name] = fn
        return fn
    return deco


def _images(batch_size: int, seed: int, classes: int = 10, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(batch_size, 3, size, size, generator=g), torch.randint(0, classes, (batch_size,), generator=g)


# --- MLPs -----------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, dims: list[int]):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class BranchyMLP(nn.Module):
    """An MLP with a branch that is never taken (its parameters never get gradients)."""

    def __init__(self, d_in: int = 32, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.body = nn.Linear(hidden, hidden)
        self.unused = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, use_branch: bool = False):
        h = F.relu(self.inp(x))
        h = F.relu(self.unused(h)) if use_branch else F.relu(self.body(h))
        return self.head(h)


@register("mlp")
def mlp(batch_size: int = 64, seed: int = 0, width: int = 1024, depth: int = 6) -> ModelBatch:
    torch.manual_seed(seed)
    model = MLP([256] + [width] * (depth - 1) + [10])
    g = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(batch_size, 256, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    return ModelBatch("mlp", model, x, y, F.cross_entropy)


@register("branchy_mlp")
def branchy_mlp(batch_size: int = 16, seed: int = 0) -> ModelBatch:
    torch.manual_seed(seed)
    model = BranchyMLP()
    g = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(batch_size, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    return ModelBatch("branchy_mlp", model, x, y, F.cross_entropy)


# --- CNNs -----------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """Conv + BatchNorm + pooling + linear head; small enough for fast parity tests."""

    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels * 2, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels * 2)
        self.fc = nn.Linear(channels * 2 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


@register("small_cnn")
def small_cnn(batch_size: int = 8, seed: int = 0) -> ModelBatch:
    torch.manual_seed(seed)
    x, y = _images(batch_size, seed, size=16)
    return ModelBatch("small_cnn", SmallCNN(), x, y, F.cross_entropy)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 inputs (CIFAR layout: 3x3 stem, no max-pool). `width` scales channels."""

    def __init__(self, classes: int = 10, width: int = 64):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        layers, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(8 * w, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@register("resnet18")
def resnet18(batch_size: int = 8, seed: int = 0, width: int = 64) -> ModelBatch:
    torch.manual_seed(seed)
    x, y = _images(batch_size, seed)
    return ModelBatch("resnet18", ResNet18(width=width), x, y, F.cross_entropy)


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG16(nn.Module):
    """VGG-16 with BatchNorm for 32x32 inputs; `width_div` divides every channel count."""

    def __init__(self, classes: int = 10, width_div: int = 1):
        super().__init__()
        layers, cin = [], 3
        for v in _VGG16:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                cout = v // width_div
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
                cin = cout
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(cin, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


@register("vgg16")
def vgg16(batch_size: int = 8, seed: int = 0, width_div: int = 1) -> ModelBatch:
    torch.manual_seed(seed)
    x, y = _images(batch_size, seed)
    return ModelBatch("vgg16", VGG16(width_div=width_div), x, y, F.cross_entropy)


@register("big_fc")
def big_fc(batch_size: int = 16, seed: int = 0, hidden: int = 4096) -> ModelBatch:
    """A small conv front and one large fully-connected layer (2048 x `hidden`, 33 MB at 4096),
    as an `nn.Sequential` so pipelines can cut it: data parallelism sends that layer's gradient
    every step, a pipeline only a batch of 2048-float activations."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(32 * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    x, y = _images(batch_size, seed)
    return ModelBatch("big_fc", model, x, y, F.cross_entropy)


# --- Branchy models --------------------------------------------------------------------------

class TwoTower(nn.Module):
    """Two independent towers over the same tokens, then a head: a wide tower (one large
    embedding: many bytes, little compute) and a deep tower (1-d convolutions over a small
    embedding: the opposite). Forward may run the towers in either order
    (`caramel.profile.branches`); which runs first decides which gradients are ready first."""

    def __init__(self, vocab: int = 62500, dim: int = 64, channels: int = 128, small_vocab: int = 256,
                 classes: int = 10):
        super().__init__()
        self.small_vocab = small_vocab
        self.wide_emb = nn.Embedding(vocab, dim)
        self.wide_proj = nn.Linear(dim, channels)
        self.deep_emb = nn.Embedding(small_vocab, dim)
        self.deep = nn.Sequential(nn.Conv1d(dim, channels, 5, padding=2), nn.ReLU(),
                                  nn.Conv1d(channels, channels, 5, padding=2), nn.ReLU(),
                                  nn.Conv1d(channels, channels, 5, padding=2), nn.ReLU())
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, idx):
        wide = torch.relu(self.wide_proj(self.wide_emb(idx).mean(1)))
        deep = self.deep(self.deep_emb(torch.remainder(idx, self.small_vocab)).transpose(1, 2)).mean(2)
        return self.head(torch.cat([wide, deep], 1))


@register("two_tower")
def two_tower(batch_size: int = 32, seed: int = 0, vocab: int = 62500, seq: int = 64, channels: int = 128) -> ModelBatch:
    """`vocab` x 64 embedding (62500: 4M parameters, 16 MB) beside a 3-layer conv tower over `seq` tokens."""
    torch.manual_seed(seed)
    model = TwoTower(vocab=vocab, channels=channels)
    g = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randint(0, vocab, (batch_size, seq), generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    return ModelBatch("two_tower", model, x, y, F.cross_entropy)


# --- Transformers ---------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float = 0.0, attn_bias: bool = True):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=dropout, bias=attn_bias, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-style decoder with tied input embedding and output projection."""

    def __init__(self, vocab: int = 256, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 64,
                 dropout: float = 0.0, attn_bias: bool = True):
        super().__init__()
        self.seq = seq
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout, attn_bias) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over (batch, time, vocab) logits."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _tokens(batch_size: int, seq: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    data = torch.randint(0, vocab, (batch_size, seq + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


@register("gpt2")
def gpt2(batch_size: int = 4, seed: int = 0, d: int = 256, layers: int = 4, heads: int = 4, seq: int = 64, vocab: int = 4096) -> ModelBatch:
    """A GPT-2-shaped model (small by default for CPU; `d=768, layers=12, vocab=50257` is GPT-2 small)."""
    torch.manual_seed(seed)
    model = GPT(vocab, d, layers, heads, seq)
    x, y = _tokens(batch_size, seq, vocab, seed)
    return ModelBatch("gpt2", model, x, y, lm_loss)


@register("tiny_gpt")
def tiny_gpt(batch_size: int = 4, seed: int = 0) -> ModelBatch:
    """A tiny tied-embedding GPT for tests. Its attention has no biases: the key bias has an
    identically zero true gradient (softmax is shift-invariant), so its computed gradient is
    rounding noise that Adam amplifies into full-size steps, and a reference that sums in
    another order (single-process training) would disagree on it by up to the learning rate."""
    torch.manual_seed(seed)
    model = GPT(vocab=64, d=32, layers=2, heads=2, seq=16, attn_bias=False)
    x, y = _tokens(batch_size, 16, 64, seed)
    return ModelBatch("tiny_gpt", model, x, y, lm_loss)


# --- Lookup ---------------------------------------------------------------------------------

def load_user_factory(spec: str) -> Callable[..., ModelBatch]:
    """`path/to/file.py:factory` -> a zoo-style factory wrapping the user's `factory()`."""
    path_str, _, fn_name = spec.rpartition(":")
    path = Path(path_str)
    if not path_str or not fn_name:
        raise CaramelError(f"model {spec!r}: expected NAME (one of {', '.join(sorted(MODELS))}) or path/to/file.py:factory")
    if not path.is_file():
        raise CaramelError(f"model {spec!r}: file {path} does not exist")
    mod_spec = importlib.util.spec_from_file_location(f"caramel_user_model_{abs(hash(path.resolve()))}", path)
    module = importlib.util.module_from_spec(mod_spec)
    assert mod_spec.loader is not None
    mod_spec.loader.exec_module(module)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise CaramelError(f"model {spec!r}: {path} has no callable named {fn_name!r}")

    def factory(batch_size: int | None = None, seed: int = 0) -> ModelBatch:
        torch.manual_seed(seed)
        out = fn()
        if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[0], nn.Module) and len(out[1]) == 2 and callable(out[2])):
            raise CaramelError(f"model {spec!r}: {fn_name}() must return (model, (inputs, targets), loss_fn)")
        model, (x, y), loss_fn = out
        return ModelBatch(path.stem, model, x, y, loss_fn)

    return factory


def get_model(name: str) -> Callable[..., ModelBatch]:
    """A zoo factory by name, or a user factory from `file.py:factory`."""
    if name in MODELS:
        return MODELS[name]
    if ":" in name or name.endswith(".py"):
        return load_user_factory(name)
    raise CaramelError(f"unknown model {name!r}; expected one of {', '.join(sorted(MODELS))} or path/to/file.py:factory")


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


