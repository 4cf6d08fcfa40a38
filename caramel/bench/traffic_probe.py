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
receiving), k = 1..n: `broadcasts_at_once_s[k - 1]`, each repetition kept
(`broadcasts_at_once_reps_s`). The ps model's pulls as fluid flows read their share of the rate
from it (`pull_efficiency_by_count`; version 4 on). The all-at-once reading switches between
two modes within a job (docs/results/ps_sim_pull_flows.md), and the pulls' model reads the
difference between the points, so from version 5 every count is timed in one interleaved sweep
(repetition r times each k) with a k = n reading of its own; version 4 timed the counts one
after another and took k = n from the broadcasts above.

The curves' cost. Each curve round moves up to a gradient's bytes through a NIC, so the curves
grow with the workers; from version 5 they are held to `CURVE_BUDGET_S` (estimated from the
all-at-once rounds just timed, the dearest): fewer repetitions, at least `MIN_CURVE_REPS`, and
where even those would pass it, only the counts 1, 2, 4, ..., n - 1 (and n), the points between
linear in k (`curve_plan`, `fill_curve`). `probe_s` (the whole probe), `curve_s` (the curves),
`curve_counts` and `curve_reps` record what was done.
"""
from __future__ import annotations

import bisect
import statistics
import time
from typing import Any

from caramel.strategies.ps.sim_pulls import pull_curve_caps

PROBE_REPS = 5  # the queue's repetitions of each kind
# the patterns' repetitions: within one job 5-repetition medians of the broadcasts read 0.63-0.80
# of the rate in consecutive blocks, 15 about half that spread (docs/results/ps_sim_flow.md)
PATTERN_REPS = 15
VERSION = 5  # 2: pushes_at_once_s (k servers receiving at once), each repetition kept; 3: PATTERN_REPS;
# 4: broadcasts_at_once_s (k servers broadcasting at once); 5: that in one sweep, the curves within a budget
CURVE_BUDGET_S = 20.0  # the per-count curves' estimated time, at most (about 9 s at 4 workers in the stored runs)
MIN_CURVE_REPS = 3  # the fewest repetitions of a curve's point; below it the curves time fewer counts
START_SHARE = 0.25  # the small broadcast starts this far into the bulk's time alone
MIN_LEFT_SHARE = 0.5  # a wait that leaves less than this share of the bulk's rest unexplained is only a lower bound


def probe_traffic(grad_bytes: int, device: Any, world: int, reps: int = PROBE_REPS,
                  pattern_reps: int = PATTERN_REPS, curve_budget_s: float = CURVE_BUDGET_S) -> dict[str, Any] | None:
    """{"version" (`VERSION`), "queue_s" (None: too short to tell), "bulk_s", "bulk_bytes",
    "all_to_all_s", "all_to_all_bytes", "broadcasts_s", "broadcasts_reps_s" (each repetition),
    "pushes_at_once_s" (k = 1..world servers receiving at once, the last the all-to-all),
    "pushes_at_once_reps_s", "broadcasts_at_once_s" (k = 1..world ranks broadcasting at once, one
    sweep), "broadcasts_at_once_reps_s" (a count between the timed ones: []), "curve_counts",
    "curve_reps", "curve_budget_s", "curve_s", "probe_s"} on every rank, or None with one worker or on
    a non-CPU device (gloo's behaviour is what is measured). Its time: the two all-at-once patterns'
    `pattern_reps` + 1 rounds each, the curves' about `curve_budget_s` at most (module docstring)."""
    if world < 2 or getattr(device, "type", "cpu") != "cpu":
        return None
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
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
    # after the two old patterns, so that their readings are taken as before; every rank plans
    # alike (the rounds' times are each the slowest rank's)
    curves_at = time.perf_counter()
    counts, curve_reps = curve_plan(world, max(statistics.median(a2a), statistics.median(bcast)), curve_budget_s,
                                    pattern_reps)
    fewer = [_all_to_all_s(shard, world, curve_reps, to, receivers=k) for k in counts]
    sweep = _broadcast_sweep(shard, world, curve_reps, to, counts + [world])
    curve_s = time.perf_counter() - curves_at
    for g in to:
        dist.destroy_process_group(g)
    pushes = fill_curve(counts, [statistics.median(t) for t in fewer], world - 1) + [statistics.median(a2a)]
    pulls = fill_curve(counts + [world], [statistics.median(t) for t in sweep], world)
    timed = dict(zip(counts, fewer))
    return {"version": VERSION, "queue_s": queue_s if queue_s < MIN_LEFT_SHARE * (bulk_s - start_s) else None,
            "bulk_s": bulk_s, "bulk_bytes": big.numel() * 4, "all_to_all_s": statistics.median(a2a),
            "broadcasts_s": statistics.median(bcast), "broadcasts_reps_s": bcast,
            "pushes_at_once_s": pushes, "pushes_at_once_reps_s": [timed.get(k, []) for k in range(1, world)] + [a2a],
            "broadcasts_at_once_s": pulls,
            "broadcasts_at_once_reps_s": [dict(zip(counts + [world], sweep)).get(k, []) for k in range(1, world + 1)],
            "all_to_all_bytes": shard.numel() * 4, "curve_counts": counts, "curve_reps": curve_reps,
            "curve_budget_s": curve_budget_s, "curve_s": curve_s, "probe_s": time.perf_counter() - started}


def curve_plan(world: int, round_s: float, budget_s: float = CURVE_BUDGET_S, most_reps: int = PATTERN_REPS
               ) -> tuple[list[int], int]:
    """The counts k < `world` the curves time and the repetitions of each: the pushes' one call per
    count and the broadcasts' sweep (those counts and `world`) take (2 counts + 1) (reps + 1)
    rounds (one warm-up each), each at most `round_s` (an all-at-once round). Every count at up to
    `most_reps` repetitions, as many as fit `budget_s`; where fewer than `MIN_CURVE_REPS` would,
    the counts 1, 2, 4, ..., world - 1 at as many as fit, at least `MIN_CURVE_REPS` (then the
    budget may be passed: by about 2 log2(world) + 1 points' rounds)."""
    def fitting(counts: list[int]) -> int:
        fit = int(budget_s / (round_s * (2 * len(counts) + 1))) - 1 if round_s > 0 else most_reps
        return min(most_reps, fit)

    counts = list(range(1, world))
    if fitting(counts) < MIN_CURVE_REPS:
        counts = sorted({min(1 << i, world - 1) for i in range(world.bit_length())})
    return counts, max(min(MIN_CURVE_REPS, most_reps), fitting(counts))


def fill_curve(counts: list[int], medians: list[float], upto: int) -> list[float]:
    """A curve's points at k = 1..`upto` from those timed at `counts` (ascending, 1 and `upto`
    among them): a timed count its own, one between linear in k."""
    if not counts or counts[0] != 1 or counts[-1] != upto or len(medians) != len(counts):
        raise ValueError(f"a curve's timed counts must run from 1 to {upto}, one median each; got {counts!r}")
    out = []
    for k in range(1, upto + 1):
        j = bisect.bisect_left(counts, k)
        if counts[j] == k:
            out.append(medians[j])
        else:
            share = (k - counts[j - 1]) / (counts[j] - counts[j - 1])
            out.append(medians[j - 1] + share * (medians[j] - medians[j - 1]))
    return out


def _broadcasts_s(shard: Any, world: int, reps: int, groups: list[Any]) -> list[float]:
    """Every rank broadcasts `shard` at once, rank j's on `groups[j]` (as each server's pulls),
    every rank receiving the others': the slowest rank's time in each of `reps` repetitions."""
    (times,) = _broadcast_sweep(shard, world, reps, groups, [world])
    return times


def _broadcast_sweep(shard: Any, world: int, reps: int, groups: list[Any], counts: list[int]) -> list[list[float]]:
    """For each k in `counts`, ranks 0..k - 1 broadcasting `shard` at once (as `_broadcasts_s`),
    interleaved: repetition r times every count, starting at count r mod len (so each count
    follows each other as often), one warm-up repetition first; each count's slowest-rank times."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    bufs = [shard if j == rank else torch.empty_like(shard) for j in range(world)]
    times: list[list[float]] = [[] for _ in counts]
    for r in range(reps + 1):
        for i in [(r + i) % len(counts) for i in range(len(counts))]:
            dist.barrier()
            t0 = time.perf_counter()
            works = [dist.broadcast(bufs[j], src=j, group=groups[j], async_op=True) for j in range(counts[i])]
            for w in works:
                w.wait()
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if r:  # the first makes the connections
                times[i].append(float(took.item()))
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
