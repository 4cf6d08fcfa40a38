"""A user's own training script, run on every worker by `caramel train --script`.

    caramel train --script examples/train_script.py --workers 2 -- --steps 50
    torchrun --nproc-per-node 2 examples/train_script.py --steps 50      # the same, by hand

It is an ordinary DDP-style loop; the only Caramel lines are `init_distributed`, `parallelize`
and `optimizer.synchronize()` before evaluating. `caramel train` starts the workers with
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), which `init_distributed` reads.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import caramel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    args = parser.parse_args()

    info = caramel.init_distributed()
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = caramel.parallelize(model, optimizer)

    # A synthetic task with a learnable answer: the class is the argmax of a fixed projection.
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    data_rng = torch.Generator().manual_seed(100 + info.rank)  # each rank draws its own samples
    first = last = None
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=data_rng)
        y = (x @ teacher).argmax(dim=1)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        first = loss.item() if first is None else first
        last = loss.item()
    optimizer.synchronize()  # every pending update applied before we evaluate

    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        accuracy = (model.module(x).argmax(dim=1) == (x @ teacher).argmax(dim=1)).float().mean().item()
    if info.rank == 0:
        print(f"train_script: {info.world_size} workers, {args.steps} steps, loss {first:.3f} -> {last:.3f}, "
              f"accuracy {100 * accuracy:.1f}%", flush=True)


if __name__ == "__main__":
    main()
