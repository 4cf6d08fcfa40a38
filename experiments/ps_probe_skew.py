"""How much of the ps traffic probe's all-at-once times is the ranks' start skew after a barrier.

The bench's probe (`caramel.bench.traffic_probe`) times every rank sending a shard to every
other at once (the colocated pushes' pattern) and every rank broadcasting a shard at once (the
pulls'), each rank from its own exit from a barrier, and keeps the slowest rank's time. In the
ps model a push or pull starts once the *last* rank has handed it over, so what it needs is
the pattern's time from the last rank's start. Every rank here is a process on one host, so
`time.perf_counter` (CLOCK_MONOTONIC) is one clock for all: this gathers each rank's start and
end per repetition and prints, per pattern, the probe's reading (slowest rank's own time),
rank 0's own time, the time from the last start to the last end, and the start skew, as
medians over `--reps` (a ring all-reduce of the gradient bytes too, for the rate). Besides the
probe's all-to-all (every rank posts its sends, then its receives) it times the same bytes
posted receives first, and posted in the engine's order of a step's pushes (one bucket per
shard, shards in order: a rank posts its receives at its own shard's turn). Every pattern sends
on the receiver's group, as the probe does; the engine sends a colocated push on the sender's
own pull group (`PsEngine.link_group`), so the order is the engine's, the group layout is not.
Nothing is fitted.

    caramel cluster run --workers 4 --bandwidth 500mbit -- \\
        python experiments/ps_probe_skew.py --reps 15 --json OUT.json
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from experiments.cluster_job import join, model_arguments, report, workload


def _timed(patterns: dict, reps: int) -> dict[str, dict]:
    """Each rank's (start, end) of every pattern per repetition, after a barrier, the patterns
    interleaved within each repetition (so that a drift of the host's load hits them alike);
    per pattern the medians in ms of: the slowest rank's own time (the probe's reading), rank
    0's own time, last start to last end, and the start skew."""
    world, rank = dist.get_world_size(), dist.get_rank()
    got: dict[str, dict[str, list[float]]] = {name: {} for name in patterns}
    for k in range(reps + 1):
        for name, f in patterns.items():
            dist.barrier()
            t0 = time.perf_counter()
            f()
            t1 = time.perf_counter()
            spans = torch.zeros(2 * world, dtype=torch.float64)
            spans[2 * rank], spans[2 * rank + 1] = t0, t1
            dist.all_reduce(spans)  # every rank's (start, end): one clock on one host
            if not k:  # the first makes the connections
                continue
            starts, ends = spans[0::2].tolist(), spans[1::2].tolist()
            for key, v in (("slowest_own", max(b - a for a, b in zip(starts, ends))), ("rank0_own", ends[0] - starts[0]),
                           ("last_start_to_last_end", max(ends) - max(starts)), ("start_skew", max(starts) - min(starts))):
                got[name].setdefault(key, []).append(v)
    out = {}
    for name, readings in got.items():
        out[name] = {k + "_ms": round(1e3 * statistics.median(v), 2) for k, v in readings.items()}
        out[name]["slowest_own_all_ms"] = [round(1e3 * x, 2) for x in readings["slowest_own"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, steps=0)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error(f"--reps must be at least 1 (timed repetitions after the one that makes the connections), "
                 f"got {args.reps}")
    rank = join()
    world = dist.get_world_size()
    w = workload(args)
    nbytes = sum(p.numel() * 4 for p in w.model.parameters())
    ranks = list(range(world))
    to = [dist.new_group(ranks) for _ in ranks]  # a group per receiver, as the probe and the pushes
    shard = torch.zeros(max(nbytes // world, 1024) // 4)
    inbox = [torch.empty_like(shard) for _ in ranks]
    bufs = [shard if j == rank else torch.empty_like(shard) for j in ranks]

    def all_to_all():
        works = [dist.isend(shard, j, group=to[j]) for j in ranks if j != rank]
        works += [dist.irecv(inbox[j], j, group=to[rank]) for j in ranks if j != rank]
        for wk in works:
            wk.wait()

    def recvs_first():
        works = [dist.irecv(inbox[j], j, group=to[rank]) for j in ranks if j != rank]
        works += [dist.isend(shard, j, group=to[j]) for j in ranks if j != rank]
        for wk in works:
            wk.wait()

    def server_order():  # in the engine's order, one bucket per shard, on the probe's groups
        works = []
        for s in ranks:
            if s == rank:
                works += [dist.irecv(inbox[j], j, group=to[s]) for j in ranks if j != rank]
            else:
                works.append(dist.isend(shard, s, group=to[s]))
        for wk in works:
            wk.wait()

    def broadcasts():
        works = [dist.broadcast(bufs[j], src=j, group=to[j], async_op=True) for j in ranks]
        for wk in works:
            wk.wait()

    from caramel.bench.lower_bound import effective_bandwidth_bps

    x = torch.randn(nbytes // 4)
    patterns = {"all_reduce": lambda: dist.all_reduce(x), "all_to_all": all_to_all, "all_to_all_recvs_first": recvs_first,
                "pushes_server_order": server_order, "broadcasts": broadcasts}
    out = {"format": "caramel.ps-probe-skew/2", "world": world, "grad_bytes": nbytes,
           "shard_bytes": shard.numel() * 4, "reps": args.reps, "torch": torch.__version__,
           **_timed(patterns, args.reps)}
    out["ring_rate_bps"] = effective_bandwidth_bps(nbytes, world, out["all_reduce"]["slowest_own_ms"] / 1e3)
    ideal_ms = 1e3 * (world - 1) * out["shard_bytes"] * 8 / out["ring_rate_bps"]
    out["ideal_at_ring_rate_ms"] = round(ideal_ms, 2)
    for k in list(patterns)[1:]:
        out[k]["efficiency_probe"] = round(min(1.0, ideal_ms / out[k]["slowest_own_ms"]), 3)
    for g in to:
        dist.destroy_process_group(g)
    report(out, args.json)


if __name__ == "__main__":
    main()
