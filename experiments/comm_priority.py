"""How long a gloo all-reduce takes while every rank computes, by the CPU priority of the
backend's threads: normal, normal with the computing thread at nice 19, and real-time
(`SCHED_FIFO` 1, what `caramel.parallelize(comm_priority="auto")` gives the engine's own).

Each rank computes (1-thread matmuls) while one all-reduce is in flight and notes when it
completes; the modes take turns in rounds in one job, switching the threads of one gloo group
between policies, so host drift hits them alike. Needs Linux and root (real-time policy and
switching back). Prints the median completion time per mode (the slowest rank's median per
round, then the median over rounds) and its ratio to normal.

    python experiments/comm_priority.py --workers 4 --bytes 600000 --rounds 8
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist

from caramel.runtime.comm_priority import lower_thread, raise_thread
from caramel.testing import run_workers

MODES = ("normal", "compute_nice19", "realtime")


def _set_mode(mode: str, comm_tids: list[int]) -> None:
    for tid in comm_tids:  # set directly: the engine's governor is not part of what is timed
        (raise_thread if mode == "realtime" else lower_thread)(tid)
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19 if mode == "compute_nice19" else 0)


def _collective_s(pg, buf: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """Issue one all-reduce, compute until it completes, and return the time it took."""
    dist.barrier(pg)
    t0 = time.perf_counter()
    work = dist.all_reduce(buf, group=pg, async_op=True)
    while not work.is_completed():
        a @ b  # ~0.2 ms at 1 thread: the completion time is known to about that
    done = time.perf_counter() - t0
    work.wait()
    for _ in range(20):  # the ranks drift apart in compute before the next one, as in training
        a @ b
    return done


def worker(rank: int, world: int, nbytes: int, rounds: int, per_round: int) -> dict:
    torch.set_num_threads(1)
    before = {int(t) for t in os.listdir("/proc/self/task")}
    pg = dist.new_group(backend="gloo")
    comm_tids = sorted({int(t) for t in os.listdir("/proc/self/task")} - before)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    buf = torch.zeros(nbytes // 4)
    medians: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                _set_mode(mode, comm_tids)
                times = [_collective_s(pg, buf, a, b) for _ in range(per_round)]
                t = torch.tensor([statistics.median(times)])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                medians[mode].append(float(t))
    finally:
        _set_mode("normal", comm_tids)
    return {"threads": len(comm_tids), "medians": medians}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--bytes", type=int, default=600_000, help="all-reduce size in bytes")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-round", type=int, default=10, help="collectives per mode per round")
    args = ap.parse_args()
    if args.workers < 2 or args.bytes < 4 or args.rounds < 1 or args.per_round < 1:
        ap.error("--workers must be >= 2, --bytes >= 4, --rounds and --per-round >= 1")
    if os.geteuid() != 0:
        ap.error("needs root: real-time thread priority, and switching threads back to normal")
    res = run_workers(worker, args.workers, args=(args.bytes, args.rounds, args.per_round),
                      timeout_s=60 + args.rounds * args.per_round * 3.0)[0]
    print(f"{args.workers} ranks on {os.cpu_count()} cores, {args.bytes} B all-reduce while computing "
          f"({res['threads']} communication threads per rank), {args.rounds} rounds x {args.per_round}:")
    base = statistics.median(res["medians"]["normal"])
    for mode in MODES:
        m = statistics.median(res["medians"][mode])
        print(f"  {mode:15s} {m * 1e3:7.2f} ms  ({m / base:.2f}x of normal)")


if __name__ == "__main__":
    main()
