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

Pushes at once. The all-to-all is every server receiving its pushes at once; in a bsp step
they are handed over staggered, and a push with few others in flight runs faster. So the probe
also times k servers receiving at once (ranks 0..k-1 each receive a shard from every other
rank; every rank sends to each of them), k = 1..n - 1 (k = n is the all-to-all):
`pushes_at_once_s[k - 1]`, the slowest rank's time, median over the repetitions, each
repetition kept (`pushes_at_once_reps_s`, as `broadcasts_reps_s`: the pull reading's spread
within a job). The ps model's fluid pushes read their share of the rate from it
(`efficiency_by_count`, `caramel.strategies.ps.sim_flows`). Records before `version` 2 lack
it; version 2 took 5 repetitions of every pattern, version 3 `PATTERN_REPS`.

Broadcasts at once. Likewise k ranks broadcasting a shard at once (ranks 0..k-1, every rank
receiving), k = 1..n - 1 (k = n is the broadcasts above): `broadcasts_at_once_s[k - 1]`, each
repetition kept (`broadcasts_at_once_reps_s`). The ps model's pulls as fluid flows read their
share of the rate from it (`pull_efficiency_by_count`; version 4 on).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from caramel.strategies.ps.sim_pulls import pull_curve_caps

PROBE_REPS = 5  # the queue's repetitions of each kind
# the patterns' repetitions: within one job 5-repetition medians of the broadcasts read 0.63-0.80
# of the rate in consecutive blocks, 15 about half that spread (docs/results/ps_sim_flow.md)
PATTERN_REPS = 15
VERSION = 4  # 2: pushes_at_once_s (k servers receiving at once), each repetition kept; 3: PATTERN_REPS;
# 4: broadcasts_at_once_s (k servers broadcasting at once)
START_SHARE = 0.25  # the small broadcast starts this far into the bulk's time alone
MIN_LEFT_SHARE = 0.5  # a wait that leaves less than this share of the bulk's rest unexplained is only a lower bound


def probe_traffic(grad_bytes: int, device: Any, world: int, reps: int = PROBE_REPS,
                  pattern_reps: int = PATTERN_REPS) -> dict[str, Any] | None:
    """{"version" (`VERSION`), "queue_s" (None: too short to tell), "bulk_s", "bulk_bytes",
    "all_to_all_s", "all_to_all_bytes", "broadcasts_s", "broadcasts_reps_s" (each repetition),
    "pushes_at_once_s" (k = 1..world servers receiving at once, the last the all-to-all),
    "pushes_at_once_reps_s", "broadcasts_at_once_s" (k = 1..world ranks broadcasting at once, the
    last the broadcasts), "broadcasts_at_once_reps_s"} on every rank, or None with one worker or on a non-CPU device
    (gloo's behaviour is what is measured). Its time grows about linearly with `world`: world + 1
    patterns of `pattern_reps` + 1 rounds, and world - 1 of broadcasts (docs/benchmarks.md)."""
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
    a2a = _all_to_all_s(shard, world, pattern_reps, to)
    bcast = _broadcasts_s(shard, world, pattern_reps, to)
    # after the two old patterns, so that their readings are taken as before
    fewer = [_all_to_all_s(shard, world, pattern_reps, to, receivers=k) for k in range(1, world)]
    fewer_bcast = [_broadcasts_s(shard, world, pattern_reps, to, senders=k) for k in range(1, world)]
    for g in to:
        dist.destroy_process_group(g)
    at_once, bcast_at_once = fewer + [a2a], fewer_bcast + [bcast]
    return {"version": VERSION, "queue_s": queue_s if queue_s < MIN_LEFT_SHARE * (bulk_s - start_s) else None,
            "bulk_s": bulk_s, "bulk_bytes": big.numel() * 4, "all_to_all_s": statistics.median(a2a),
            "broadcasts_s": statistics.median(bcast), "broadcasts_reps_s": bcast,
            "pushes_at_once_s": [statistics.median(t) for t in at_once], "pushes_at_once_reps_s": at_once,
            "broadcasts_at_once_s": [statistics.median(t) for t in bcast_at_once],
            "broadcasts_at_once_reps_s": bcast_at_once, "all_to_all_bytes": shard.numel() * 4}


def _broadcasts_s(shard: Any, world: int, reps: int, groups: list[Any], senders: int | None = None) -> list[float]:
    """Ranks 0..`senders` - 1 (default: every rank) broadcast `shard` at once, rank j's on
    `groups[j]` (as each server's pulls), every rank receiving the others': the slowest rank's
    time in each of `reps` repetitions."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    bufs = [shard if j == rank else torch.empty_like(shard) for j in range(world)]
    times = []
    for k in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.broadcast(bufs[j], src=j, group=groups[j], async_op=True) for j in range(senders or world)]
        for w in works:
            w.wait()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if k:
            times.append(float(took.item()))
    return times


def _all_to_all_s(shard: Any, world: int, reps: int, to: list[Any], receivers: int | None = None) -> list[float]:
    """Every rank sends `shard` to each of ranks 0..`receivers` - 1 (default: every rank) other
    than itself at once, what goes to rank j on `to[j]` (gloo carries one group's messages
    between two ranks on one connection, one at a time each way): the slowest rank's time in
    each of `reps` repetitions."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    receivers = world if receivers is None else receivers
    inbox = [torch.empty_like(shard) for _ in range(world)]
    times = []
    for k in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.isend(shard, j, group=to[j]) for j in range(receivers) if j != rank]
        if rank < receivers:
            works += [dist.irecv(inbox[j], j, group=to[rank]) for j in range(world) if j != rank]
        for w in works:
            w.wait()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if k:  # the first makes the connections
            times.append(float(took.item()))
    return times


def efficiency(probed: dict[str, Any] | None, pattern: str, world: int, bandwidth_bps: float | None) -> float | None:
    """The share of `bandwidth_bps` the probe's `pattern` ("all_to_all" or "broadcasts") achieved:
    in both each rank's link carries (world - 1) shards (in, or out); None without a measurement
    or a rate; at most 1 (the probe's noise never speeds the model up)."""
    took = (probed or {}).get(f"{pattern}_s")
    if not took or not bandwidth_bps or world < 2:
        return None
    ideal_s = (world - 1) * probed["all_to_all_bytes"] * 8 / bandwidth_bps
    return min(1.0, ideal_s / took)


def efficiency_by_count(probed: dict[str, Any] | None, world: int, bandwidth_bps: float | None) -> list[float] | None:
    """The share of `bandwidth_bps` each server's NIC receives at while k servers receive their
    pushes at once, k = 1..world (`pushes_at_once_s`; each receiver's link carries world - 1
    shards whatever k, the senders' fewer): None for a probe before version 2, without a rate
    or with one worker; each at most 1, as `efficiency`."""
    took = (probed or {}).get("pushes_at_once_s")
    if not took or not bandwidth_bps or world < 2:
        return None
    if len(took) != world:
        raise ValueError(f"the traffic probe's pushes_at_once_s has {len(took)} points for {world} workers")
    ideal_s = (world - 1) * probed["all_to_all_bytes"] * 8 / bandwidth_bps
    return [min(1.0, ideal_s / t) for t in took]


def pull_efficiency_by_count(probed: dict[str, Any] | None, world: int, bandwidth_bps: float | None
                             ) -> list[float] | None:
    """The share of `bandwidth_bps` at which each broadcasting server sends its world - 1 copies
    while k servers broadcast at once, k = 1..world (`broadcasts_at_once_s`): None for a probe
    before version 4, without a rate or with one worker. A broadcast that relays through its
    receivers (gloo's tree) can beat world - 1 copies from the root, so a point may exceed 1, up
    to what the links allow (`pull_curve_caps`: a rank that sends none receives k copies); the
    noise never speeds the model past that."""
    took = (probed or {}).get("broadcasts_at_once_s")
    if not took or not bandwidth_bps or world < 2:
        return None
    if len(took) != world:
        raise ValueError(f"the traffic probe's broadcasts_at_once_s has {len(took)} points for {world} workers")
    ideal_s = (world - 1) * probed["all_to_all_bytes"] * 8 / bandwidth_bps
    return [min(cap, ideal_s / t) for cap, t in zip(pull_curve_caps(world), took)]
