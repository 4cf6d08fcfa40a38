"""Worker functions for the unequal-replica pipeline tests (spawned; must be importable)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import caramel
from tests.strategies.pipeline.workers import batch, make_model, max_diff, sgd

STEPS = 6


def oracle(steps: int, opt: str, size: int, keep: slice = slice(None)) -> dict[str, torch.Tensor]:
    """Single-process training on each step's whole batch (or only its samples `keep`)."""
    model = make_model()
    o = torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam" else sgd(model.parameters())
    for step in range(steps):
        x, y = batch(step, size=size)
        F.cross_entropy(model(x[keep]), y[keep]).backward()
        o.step()
        o.zero_grad()
    return model.state_dict()


def unequal_worker(rank: int, world: int, configs: dict, steps: int = STEPS) -> dict:
    """Each config (replicas, schedule, optimizer, microbatches, batch size) trained `steps`
    steps, every rank passing the same whole batch; its parameters against the oracle's."""
    out = {}
    for name, (replicas, schedule, opt, micro, size) in configs.items():
        model = make_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam" else sgd
        stages = len(str(replicas).split("+")) if isinstance(replicas, str) else len(replicas)
        # microbatches="auto": the count and the cut both chosen from a profile (on rank 0, sent to all)
        pipe = caramel.pipeline(model, optimizer, stages=stages, microbatches=micro, schedule=schedule,
                                partition="auto" if micro == "auto" else [3, 5][: stages - 1], replicas=replicas)
        losses = [float(pipe.step(*batch(step, size=size), F.cross_entropy)) for step in range(steps)]
        final = pipe.state_dict()
        half = size // 2
        out[name] = {"diff": max_diff(final, oracle(steps, opt, size)), "losses": losses,
                     # control: the first half of each batch alone gives other parameters
                     "half_diff": max_diff(final, oracle(steps, opt, size, slice(0, half))),
                     "stage": pipe.layout.stage, "replica": pipe.layout.replica,
                     "virtual": [v for v, _, _ in pipe.layout.virtual], "bubble": pipe.bubble_stats(),
                     "microbatches": pipe.options.microbatches, "boundaries": pipe.boundaries}
        # the first loss equals the oracle's first loss on the whole batch (every rank has it)
        x, y = batch(0, size=size)
        with torch.no_grad():
            out[name]["first_loss"] = float(F.cross_entropy(make_model()(x), y))
    if world == 4:  # counts that do not sum to the world: one clear error on every rank, before any group
        try:
            caramel.pipeline(make_model(), sgd, stages=2, microbatches=4, schedule="gpipe", replicas="2+1")
        except caramel.CaramelError as e:
            out["world_error"] = str(e)
    return out
