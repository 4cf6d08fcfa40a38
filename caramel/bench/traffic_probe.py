"""How the job's links carry a parameter server's traffic, beyond their rate: inputs of the ps
model (`caramel.strategies.ps.simulate`), measured on the links, never fitted to a strategy's steps.

The queue. How long a small message waits behind a bulk transfer (`caramel.strategies.ps.queues`).

Rank 1 sends a bulk message (twice the model's gradient bytes) to rank 0; a quarter of its way
through, a small broadcast runs on a group of its own, once from rank 1 (its data goes behind
the bulk) and once from rank 0 (its data goes the other way, but gloo's note that rank 1 is
ready to receive goes behind the bulk). The wait is when rank 0 has the small broadcast less
when it started; the probe's result is the median over both kinds and the repetitions. A
TCP flow keeps only so much queued on a shaped link (measured on the emulated cluster:
docs/results/ps-history.md, "Queues and patterns (issue 28)", and docs/results/link_queue_*.json),
so the wait is that, not the bulk's time left.

Measured on ranks 0 and 1 (every rank creates the groups and meets the barriers); the others
wait. A bulk too short to outlast the quarter-way start plus a few ms of queue gives only a
lower bound; the probe then reports no queue (no evidence: the model leaves queues out).

All to all. Every rank sends a shard's worth (the gradient bytes over the ranks) to every other
at once, as the colocated servers' pushes (and pulls) do: with n - 1 flows into each link and
every rank's transfers on a shared host's cores this runs below the rate a ring achieves (at 4
workers on 2 cores; the shares measured: docs/results/ps-history.md, "Queues and patterns
(issue 28)"). The slowest rank's time, the median of the repetitions; `efficiency` turns it
into a share of a rate. And every rank broadcasting a shard at once, as the servers' pulls do
(gloo's broadcast relays through the receivers, so it fares better than the all-to-all).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

PROBE_REPS = 5
START_SHARE = 0.25  # the small broadcast starts this far into the bulk's time alone
MIN_LEFT_SHARE = 0.5  # a wait that leaves less than this share of the bulk's rest unexplained is only a lower bound


def probe_traffic(grad_bytes: int, device: Any, world: int, reps: int = PROBE_REPS) -> dict[str, Any] | None:
    """{"queue_s" (None: too short to tell), "bulk_s", "bulk_bytes", "all_to_all_s",
    "all_to_all_bytes"} on every rank, or None with one worker or on a non-CPU device (gloo's
    behaviour is what is measured)."""
    if world < 2 or getattr(device, "type", "cpu") != "cpu":
        return None
    import torch
    import torch.distributed as dist

    ranks = list(range(world))
    bulk_g, small_g = dist.new_group(ranks), dist.new_group([0, 1])
    rank = dist.get_rank()
    big = torch.zeros(max(2 * int(grad_bytes), 1 << 20) // 4, device=device)  # outlasts the start and a queue
    small = torch.zeros(1024, device=device)

    def bulk():
        if rank == 1:
            return dist.isend(big, 0, group=bulk_g)
        return dist.irecv(big, 1, group=bulk_g) if rank == 0 else None

    def timed_bulk() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        w = bulk()
        if w is not None:
            w.wait()
        return time.perf_counter() - t0

    timed_bulk()  # warm-up: connections made
    alone = torch.tensor([timed_bulk()], dtype=torch.float64)
    dist.broadcast(alone, src=0)  # rank 0's, the receiver's, time: when the bulk has landed
    bulk_s = float(alone.item())
    start_s = START_SHARE * bulk_s
    waits = []
    for src in (1, 0):
        for _ in range(reps):
            dist.barrier()
            w = bulk()
            if rank in (0, 1):
                time.sleep(start_s)
                t1 = time.perf_counter()
                dist.broadcast(small, src=src, group=small_g)
                waits.append(time.perf_counter() - t1)
            if w is not None:
                w.wait()
    out = torch.tensor([statistics.median(waits) if rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(out, src=0)
    for g in (bulk_g, small_g):
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    queue_s = float(out.item())
    shard = torch.zeros(max(int(grad_bytes) // world, 1024) // 4, device=device)
    to = [dist.new_group(ranks) for _ in ranks]  # a group per receiver, as each server's pushes have
    a2a_s = _all_to_all_s(shard, world, reps, to)
    bcast_s = _broadcasts_s(shard, world, reps, to)
    for g in to:
        dist.destroy_process_group(g)
    return {"queue_s": queue_s if queue_s < MIN_LEFT_SHARE * (bulk_s - start_s) else None, "bulk_s": bulk_s,
            "bulk_bytes": big.numel() * 4, "all_to_all_s": a2a_s, "broadcasts_s": bcast_s,
            "all_to_all_bytes": shard.numel() * 4}


def _broadcasts_s(shard: Any, world: int, reps: int, groups: list[Any]) -> float:
    """Every rank broadcasts `shard` at once, rank j's on `groups[j]` (as each server's pulls):
    the slowest rank's time, median over `reps`."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    bufs = [shard if j == rank else torch.empty_like(shard) for j in range(world)]
    times = []
    for k in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.broadcast(bufs[j], src=j, group=groups[j], async_op=True) for j in range(world)]
        for w in works:
            w.wait()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if k:
            times.append(float(took.item()))
    return statistics.median(times)


def _all_to_all_s(shard: Any, world: int, reps: int, to: list[Any]) -> float:
    """Every rank sends `shard` to every other at once, what goes to rank j on `to[j]` (gloo
    carries one group's messages between two ranks on one connection, one at a time each way):
    the slowest rank's time, median over `reps`."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    inbox = [torch.empty_like(shard) for _ in range(world)]
    times = []
    for k in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.isend(shard, j, group=to[j]) for j in range(world) if j != rank]
        works += [dist.irecv(inbox[j], j, group=to[rank]) for j in range(world) if j != rank]
        for w in works:
            w.wait()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if k:  # the first makes the connections
            times.append(float(took.item()))
    return statistics.median(times)


def efficiency(probed: dict[str, Any] | None, pattern: str, world: int, bandwidth_bps: float | None) -> float | None:
    """The share of `bandwidth_bps` the probe's `pattern` ("all_to_all" or "broadcasts") achieved:
    in both each rank's link carries (world - 1) shards (in, or out); None without a measurement
    or a rate; at most 1 (the probe's noise never speeds the model up)."""
    took = (probed or {}).get(f"{pattern}_s")
    if not took or not bandwidth_bps or world < 2:
        return None
    ideal_s = (world - 1) * probed["all_to_all_bytes"] * 8 / bandwidth_bps
    return min(1.0, ideal_s / took)
