"""Where the gossip strategy's step goes on the emulated cluster, against what its model assumes.

The bench's gossip model (`caramel.strategies.gossip.simulate`) predicts ring gossip 20-30%
below its measured step. This times, on 2 workers, in one process:

- the compute-only step (no communication), as the bench's baseline;
- the exchange alone: `Exchange.start` + `flush` of the model's gossiped tensors with nothing
  else running, next to an all-reduce of the same bytes on a plain gloo group and on one whose
  threads get the priority the bench's comm-only baseline gets (`baseline_group`);
- gossip steps through `caramel.parallelize` (per `--cap` message size): the forward (and the
  part of it spent waiting for arrivals), backward, and `optimizer.step()` split into the mix
  of what is still pending, the user's update and the start of the next exchange (snapshot,
  hand-over), each with time.perf_counter.

    caramel cluster run --workers 2 --bandwidth 264mbit -- \\
        python experiments/gossip_breakdown.py --json docs/results/gossip_breakdown.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from experiments.cluster_job import join, median_ms, model_arguments, report, workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, steps=25)
    ap.add_argument("--caps", default="4,0.25", help="gossip bucket_cap_mb values to time, comma-separated")
    args = ap.parse_args()
    rank = join()
    import caramel
    from caramel.bench.strategies import StrategyContext, baseline_group
    from caramel.strategies.gossip.options import GossipOptions
    from caramel.strategies.gossip.topology import neighbours

    med = lambda xs: round(median_ms(xs), 2)  # noqa: E731

    def fresh():
        return workload(args)

    def plain(w, opt):
        loss = w.loss_fn(w.model(w.inputs), w.targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out: dict = {"format": "caramel.gossip-breakdown/1", "model": args.model, "width": args.width,
                 "batch_size": args.batch_size, "steps": args.steps, "torch": torch.__version__,
                 "bandwidth_bps": os.environ.get("CARAMEL_CLUSTER_BANDWIDTH_BPS")}
    w = fresh()
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    comp = []
    for _ in range(args.steps):
        dist.barrier()
        t = time.perf_counter()
        plain(w, opt)
        comp.append(time.perf_counter() - t)
    out["compute_ms"] = med(comp[3:])

    # the exchange alone, and an all-reduce of the same bytes two ways
    nbytes = sum(p.numel() * 4 for p in w.model.parameters())
    out["param_bytes"] = nbytes
    x = torch.randn(nbytes // 4)

    def timed(f, reps=12):
        f()
        ts = []
        for _ in range(reps):
            dist.barrier()
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return med(ts)

    plain_group = dist.new_group([0, 1])
    prio_group, _ = baseline_group(StrategyContext(device=torch.device("cpu"), rank=rank, world_size=2))
    out["allreduce_plain_group_ms"] = timed(lambda: dist.all_reduce(x, group=plain_group))
    out["allreduce_priority_group_ms"] = timed(lambda: dist.all_reduce(x, group=prio_group))

    for cap in [float(c) for c in args.caps.split(",")]:
        w = fresh()
        opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
        model, gopt = caramel.parallelize(w.model, opt, "gossip", options=GossipOptions(topology="ring",
                                                                                      bucket_cap_mb=cap))
        run = gopt.gossip
        ex = run.exchange
        marks: dict[str, list[float]] = {}

        def mark(name, v):
            marks.setdefault(name, []).append(v)

        orig_before, orig_after = run.before_update, run.after_update

        def before_update():
            t = time.perf_counter()
            r = orig_before()
            mark("step_mix_pending_ms", time.perf_counter() - t)
            return r

        def after_update(waited):
            t = time.perf_counter()
            orig_after(waited)
            mark("step_start_exchange_ms", time.perf_counter() - t)

        run.before_update, run.after_update = before_update, after_update
        rows = []
        for k in range(args.steps):
            t0 = time.perf_counter()
            w0 = ex.wait_s
            y = model(w.inputs)
            loss = w.loss_fn(y, w.targets)
            t1 = time.perf_counter()
            fwd_wait = ex.wait_s - w0
            loss.backward()
            t2 = time.perf_counter()
            gopt.step()
            gopt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            rows.append({"step": k, "forward_ms": (t1 - t0), "forward_wait_ms": fwd_wait,
                         "backward_ms": t2 - t1, "optimizer_step_ms": t3 - t2, "step_ms": t3 - t0})
        gopt.synchronize()
        keep = [r for r in rows[3:] if r["step"] % run.options.consensus_every != 0]
        res = {k: med([r[k] for r in keep]) for k in ("forward_ms", "forward_wait_ms", "backward_ms",
                                                       "optimizer_step_ms", "step_ms")}
        res["step_mean_ms"] = round(1e3 * statistics.mean(r["step_ms"] for r in keep), 2)
        res["consensus_step_ms"] = med([r["step_ms"] for r in rows[3:] if r["step"] % run.options.consensus_every == 0]
                                       or [0.0])
        res.update({k: med(v[3:]) for k, v in marks.items()})
        res["buckets"] = len(ex.buckets)
        res["bucket_bytes"] = [b.nbytes for b in ex.buckets]

        # the same exchange with nothing else running: start + wait for every bucket
        def exchange_only():
            ex.start(neighbours(run.matrices[0], run.rank))
            ex.settle()
            ex.pending.clear()

        res["exchange_alone_ms"] = timed(exchange_only)
        out[f"gossip_cap_{cap:g}"] = res
        caramel.shutdown()
    report(out, args.json)


if __name__ == "__main__":
    main()
