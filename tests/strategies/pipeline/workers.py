"""Worker functions for the pipeline tests (spawned; must be importable), and their oracles."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import caramel

BATCH, MICRO = 8, 4


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32),
                         nn.Tanh(), nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 10))


def batch(step: int, replica: int = 0, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + 31 * step + replica)
    x = torch.randn(size, 16, generator=g)
    return x, (x[:, :10] * 3).argmax(dim=1)  # a learnable rule, so training converges


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def reference(steps: int, replicas: int = 1, opt: str = "sgd") -> dict[str, torch.Tensor]:
    """Single-process training on the whole (all replicas') batch."""
    model = make_model()
    o = sgd(model.parameters()) if opt == "sgd" else torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        xs, ys = zip(*(batch(step, r) for r in range(replicas)))
        loss = F.cross_entropy(model(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        o.step()
        o.zero_grad()
    return model.state_dict()


def max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b), (list(a), list(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def sync_worker(rank: int, world: int, steps: int) -> dict:
    """Every synchronous schedule against single-process training; state dict round trip."""
    out = {}
    configs = {"gpipe": dict(schedule="gpipe", partition=[3]),
               "1f1b": dict(schedule="1f1b", partition=[5]),
               "interleaved": dict(schedule="interleaved", stages=4, partition=[2, 4, 6]),
               "1f1b_auto_adam": dict(schedule="1f1b", partition="auto")}
    for name, cfg in configs.items():
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3) if "adam" in name else sgd
        cfg = {"stages": 2, **cfg}
        pipe = caramel.pipeline(model, opt, microbatches=MICRO, **cfg)
        losses = [float(pipe.step(*batch(step), F.cross_entropy)) for step in range(steps)]
        state = pipe.state_dict()
        out[name] = {"diff": max_diff(state, reference(steps, opt="adam" if "adam" in name else "sgd")),
                     "losses": losses, "boundaries": pipe.boundaries}
    # load a state, train one more step: the same as the reference's next step from that state
    pipe.load_state_dict(reference(0))
    out["reloaded"] = max_diff(pipe.state_dict(), reference(0))
    return out


def hybrid_worker(rank: int, world: int, steps: int) -> dict:
    """stages=2 x replicas=2: each replica trains its own batch; the result is whole-batch training."""
    pipe = caramel.pipeline(make_model(), sgd, stages=2, microbatches=MICRO, schedule="1f1b", partition=[3],
                            replicas=2)
    for step in range(steps):
        pipe.step(*batch(step, pipe.layout.replica), F.cross_entropy)
    return {"diff": max_diff(pipe.state_dict(), reference(steps, replicas=2)), "layout": pipe.layout.stage_indices}
