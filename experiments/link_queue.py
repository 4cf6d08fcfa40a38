"""How long a small message waits behind a bulk transfer on the emulated cluster (2 workers).

Rank 1 sends `bulk` bytes to rank 0 on one gloo group; `delay_ms` later a small broadcast runs
on another group, from rank 0 (the data goes 0 -> 1, with the bulk's direction idle) or from
rank 1 (the data goes 1 -> 0 behind the bulk). Gloo sends a message only once the receiver
has said it is ready, so a broadcast from rank 0 still sends a note 1 -> 0, behind the bulk.
Reported per case: the bulk's own time, when the small broadcast ended on each rank (ms from
the bulk's start) and the bulk's time left then. This is what `caramel.strategies.ps.queues`
models.

    caramel cluster run --workers 2 --bandwidth 340mbit -- \\
        python experiments/link_queue.py --json docs/results/link_queue_340mbit.json
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from experiments.cluster_job import join, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rank = join()
    bulk_g, small_g = dist.new_group([0, 1]), dist.new_group([0, 1])
    small = torch.zeros(2048)
    rows = []
    for nbytes in (350_000, 1_400_000, 2_800_000):
        big = torch.zeros(nbytes // 4)
        for src in (0, 1):
            for delay_ms in (0.0, 5.0):
                bulk_ms, small_end = [], []
                for _ in range(args.reps):
                    dist.barrier()
                    t0 = time.perf_counter()
                    work = dist.isend(big, 0, group=bulk_g) if rank == 1 else dist.irecv(big, 1, group=bulk_g)
                    time.sleep(delay_ms / 1e3)
                    dist.broadcast(small, src=src, group=small_g)
                    small_end.append(time.perf_counter() - t0)
                    work.wait()
                    bulk_ms.append(time.perf_counter() - t0)
                got: list = [None] * 2
                dist.all_gather_object(got, (statistics.median(small_end) * 1e3, statistics.median(bulk_ms) * 1e3))
                rows.append({"bulk_bytes": nbytes, "small_from": src, "delay_ms": delay_ms,
                             "bulk_ms_at_receiver": round(got[0][1], 2),
                             "small_end_ms": [round(g[0], 2) for g in got]})
    report({"format": "caramel.link-queue/1", "rows": rows}, args.json)


if __name__ == "__main__":
    main()
