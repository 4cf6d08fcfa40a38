"""What the timing scripts run under `caramel cluster run` share: the model they time, the
gloo process group (one compute thread per worker), and rank 0's report."""
from __future__ import annotations

import argparse
import json
import statistics
import warnings
from typing import Any

import torch
import torch.distributed as dist

from caramel.jsonio import write_json


def model_arguments(ap: argparse.ArgumentParser, steps: int) -> None:
    """--model, --width, --batch-size, --steps (default `steps`) and --json."""
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--json", default=None)


def join(quiet: bool = True) -> int:
    """This worker's rank in a gloo group of the launcher's, one compute thread each;
    `quiet` silences warnings (torch's deprecation notes, DDP's hints)."""
    if quiet:
        warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank()


def workload(args: argparse.Namespace) -> Any:
    """A fresh copy of the zoo model of `model_arguments`, the same on every rank."""
    from caramel.models import get_model

    return get_model(args.model)(seed=0, width=args.width, batch_size=args.batch_size)


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def report(out: dict[str, Any] | None, json_path: str | None) -> None:
    """Rank 0 prints `out` and writes it to `json_path` (if given); every rank leaves the group."""
    if dist.get_rank() == 0:
        print(json.dumps(out, indent=1), flush=True)
        if json_path:
            write_json(json_path, out)
    dist.destroy_process_group()
