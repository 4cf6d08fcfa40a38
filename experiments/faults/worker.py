"""The worker that fault experiments run: a small, deterministic Caramel training job.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python -m experiments.faults.worker --out DIR --steps 40 --step-sleep-s 0.05

Every rank appends one line per finished step to `DIR/rank<r>.progress` ("<step> <pid> <time>"),
so a harness outside can inject a fault at a chosen step, and at the end writes
`DIR/rank<r>.done.json` with a checksum of its final parameters (what "nothing lost" is
compared on). Options make ranks disagree on purpose (`--model-variant`, `--plan-planner`,
`--skip-step`) so that the mismatch checks can be exercised. Errors propagate: the process
exits non-zero with the engine's message on stderr, which is exactly what the harness measures.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

PROGRESS_SUFFIX = ".progress"
DONE_SUFFIX = ".done.json"


def build_model(variant: str, width: int):
    """A 3-layer MLP; variant "wide" changes one layer's shape (a model mismatch across ranks)."""
    import torch.nn as nn
    hidden = width + 1 if variant == "wide" else width
    layers = [nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, width), nn.ReLU(), nn.Linear(width, 4)]
    if variant == "deep":
        layers[-1:-1] = [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def param_checksum(module) -> str:
    """SHA-256 of every parameter's bytes in order: equal only for bit-identical parameters."""
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.faults.worker", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for progress and result files")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to run (steps)")
    p.add_argument("--step-sleep-s", type=float, default=0.05, help="extra compute per step, so a fault lands mid-run (seconds)")
    p.add_argument("--width", type=int, default=64, help="hidden width of the MLP (features)")
    p.add_argument("--planner", default="fifo", help="Caramel planner")
    p.add_argument("--overlap", default="forward", help="Caramel overlap mode")
    p.add_argument("--check-every", type=int, default=5, help="steps between the engine's plan-agreement checks")
    p.add_argument("--timeout-s", type=float, default=None, help="collective timeout (seconds; default CARAMEL_TIMEOUT_S)")
    p.add_argument("--model-variant", default="base", choices=("base", "wide", "deep"),
                   help="model shape on this rank (ranks that differ must fail with MismatchError)")
    p.add_argument("--plan-bucket-kb", type=float, default=0.0,
                   help="give parallelize an explicit fifo plan with this bucket cap (kB; 0 = plan online); ranks that differ must fail")
    p.add_argument("--skip-step", type=int, default=-1,
                   help="on this rank, run step N's backward under no_sync (a data-dependent branch that skips a collective)")
    p.add_argument("--replan", default="off", help="parallelize(replan=...)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import caramel
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = caramel.init_distributed(timeout_s=args.timeout_s)
    rank = info.rank
    torch.manual_seed(0)  # same initial model everywhere (parallelize broadcasts rank 0's anyway)
    model = build_model(args.model_variant, args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    options = dict(planner=args.planner, overlap=args.overlap, check_every=args.check_every, timeout_s=args.timeout_s)
    if args.replan != "off":
        options["replan"] = args.replan
    if args.plan_bucket_kb > 0:
        options["plan"] = _plan_for(model, args.plan_bucket_kb, info.world_size)
    model, optimizer = caramel.parallelize(model, optimizer, **options)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    progress = open(out / f"rank{rank}{PROGRESS_SUFFIX}", "a", buffering=1)
    for step in range(args.steps):
        x = torch.randn(32, 16, generator=gen)
        y = torch.randint(0, 4, (32,), generator=gen)
        if args.step_sleep_s > 0:
            time.sleep(args.step_sleep_s)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if step == args.skip_step:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        progress.write(f"{step + 1} {os.getpid()} {time.time():.6f}\n")
    optimizer.synchronize()
    stats = optimizer.engine.stats_dict() if hasattr(optimizer.engine, "stats_dict") else optimizer.engine.stats()
    result = {"rank": rank, "steps": args.steps, "checksum": param_checksum(model.module),
              "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str, type(None)))}}
    extra = getattr(getattr(optimizer.engine, "stats", None), "extra", None)
    if isinstance(extra, dict):
        result["extra"] = json.loads(json.dumps(extra, default=str))
    (out / f"rank{rank}{DONE_SUFFIX}").write_text(json.dumps(result) + "\n")
    progress.close()
    # leave together, as a training script should: no rank tears down its connections while
    # a peer still uses them
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _plan_for(model, bucket_kb: float, world_size: int):
    """A fifo plan for `model` made here, without profiling (reverse registration order, DDP's first guess)."""
    from caramel.strategies.planners import make_plan
    from caramel.strategies.caramel.profiling import registration_profile
    from caramel.profile.profiler import unique_params
    names, params = unique_params(model)
    mb = bucket_kb / 1000.0
    return make_plan("fifo", registration_profile(names, params), world_size=world_size,
                     bucket_cap_mb=mb, first_bucket_mb=mb)


if __name__ == "__main__":
    sys.exit(main())
