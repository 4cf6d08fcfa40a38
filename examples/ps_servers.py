"""A ps training script that runs unchanged with colocated or dedicated parameter servers.

    caramel cluster run --workers 2 -- python examples/ps_servers.py                   # colocated
    caramel cluster run --workers 3 --ps-servers 1 -- python examples/ps_servers.py    # + 1 server process
    CARAMEL_PS_SERVERS=1 torchrun --nproc-per-node 3 examples/ps_servers.py            # the same by hand

Every rank runs it. On a dedicated server rank `caramel.parallelize` serves until the workers
shut the model down, then exits the script with code 0, so nothing below it runs there. The
workers train ResNet-18 (width 16) on synthetic batches and rank 0 prints the median step time
over the steps after the warm-up (the first steps include the online profile) and TicTac's E
and S of the run (`--json PATH`: those, the step times and the plan's predictions, as JSON).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import caramel
from caramel.jsonio import format_tag, write_json
from caramel.models import get_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="ps", help="the ps spec, e.g. ps:consistency=ssp:2")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the median (profile, warm-up)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per worker per step")
    parser.add_argument("--json", default=None, help="rank 0 writes the step times, E and S here")
    args = parser.parse_args()

    caramel.init_distributed()
    w = get_model("resnet18")(batch_size=args.batch_size, seed=0, width=16)
    optimizer = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = caramel.parallelize(w.model, optimizer, args.strategy)  # a server stays here, then exits
    workers = optimizer.ps.engine.workers  # the ranks that train: 0 .. workers-1
    rank = dist.get_rank()
    times = []
    for step in range(args.steps):
        batch = get_model("resnet18")(batch_size=args.batch_size, seed=1 + step * workers + rank, width=16)
        t0 = time.perf_counter()
        w.loss_fn(model(batch.inputs), batch.targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
    optimizer.synchronize()
    if rank == 0:
        median_ms = statistics.median(times[args.warmup:]) * 1e3
        stats = optimizer.ps.stats_dict()
        print(f"ps_servers: {args.strategy}, {workers} workers of {dist.get_world_size()} ranks: "
              f"median step {median_ms:.1f} ms, E {stats['E_median']}, S {stats['S']}", flush=True)
        if args.json:
            write_json(args.json, {"format": format_tag("ps-servers-run"), "strategy": args.strategy,
                                   "workers": workers, "ranks": dist.get_world_size(), "step_s": times[args.warmup:],
                                   "median_step_ms": median_ms, "order": stats["order"], "E_median": stats["E_median"],
                                   "S": stats["S"], "predicted": stats["predicted"],
                                   "pull_buckets": stats["pull_buckets"], "pull_comm_s": stats["pull_comm_s"],
                                   "log": optimizer.ps.log})
    caramel.shutdown()  # the servers leave now


if __name__ == "__main__":
    main()
