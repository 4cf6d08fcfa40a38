"""Two ranks sending each other a large message at once: one gloo group, or one per direction.

Run under the emulated cluster (one worker per namespace, shaped links), for example

    caramel cluster run --workers 2 --bandwidth 348mbit -- \\
        python experiments/p2p_directions.py --mb 2.8 --json docs/results/p2p_directions.json

Each way of sending is timed `--reps` times (barrier, exchange, barrier): one group with one
message each way (what a single `batch_isend_irecv` does), one group with the message cut in 8,
one group per direction (what the gossip exchange does), and an all-reduce of the same bytes
for reference. Rank 0 prints (and writes) every time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from experiments.cluster_job import join, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=2.8, help="message size each way, MB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rank, world = join(quiet=False), dist.get_world_size()
    if world != 2:
        raise SystemExit(f"p2p_directions needs exactly 2 ranks, got {world}")
    peer = 1 - rank
    up, down = dist.new_group([0, 1]), dist.new_group([0, 1])
    x = torch.randn(int(args.mb * 1e6 / 4))
    y = torch.empty_like(x)

    def timed(f) -> list[float]:
        f()
        out = []
        for _ in range(args.reps):
            dist.barrier()
            t = time.perf_counter()
            f()
            dist.barrier()
            out.append((time.perf_counter() - t) * 1e3)
        return out

    def one_group(pieces: int):
        xs, ys = list(x.chunk(pieces)), list(y.chunk(pieces))

        def f() -> None:
            ops = []
            for k in range(pieces):
                ops += [dist.P2POp(dist.isend, xs[k], peer, tag=k), dist.P2POp(dist.irecv, ys[k], peer, tag=k)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return f

    def per_direction() -> None:
        send_g, recv_g = (up, down) if rank == 0 else (down, up)
        for w in [dist.isend(x, peer, group=send_g), dist.irecv(y, peer, group=recv_g)]:
            w.wait()

    ways = {"one_group": one_group(1), "one_group_8_pieces": one_group(8), "group_per_direction": per_direction,
            "allreduce": lambda: dist.all_reduce(x)}
    times = {name: timed(f) for name, f in ways.items()}
    out = {"format": "caramel.p2p-directions/1", "mb_each_way": args.mb, "reps": args.reps,
           "bandwidth_bps": os.environ.get("CARAMEL_CLUSTER_BANDWIDTH_BPS"), "torch": torch.__version__,
           "median_ms": {k: statistics.median(v) for k, v in times.items()},
           "times_ms": {k: [round(t, 1) for t in v] for k, v in times.items()}}
    report(out, args.json)


if __name__ == "__main__":
    main()
