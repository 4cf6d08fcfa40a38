"""Where the ps strategy's step goes on the emulated cluster, against what its model assumes.

The bench's ps model (`caramel.strategies.ps.simulate`) predicts the colocated bsp parameter
server 25-30% below its measured step. This times, on 2 workers, in one process:

- the compute-only step (no communication), as the bench's baseline, and an all-reduce of the
  model's gradient bytes on a group like the comm-only baseline's (`baseline_group`);
- the plan's pushes alone (one `dist.reduce` per bucket to its shard's server, every shard's
  sequence on its own push group, side by side) and its pulls alone (one `dist.broadcast` per
  bucket), with nothing else running;
- ps steps through `caramel.parallelize`: the forward (and its wait for pulls), backward, and
  `optimizer.step()` split into the wait for the step's reductions, the shard's optimizer
  and the rest (pushes of what never became ready, the used-count all-reduce, pull hand-over).

    caramel cluster run --workers 2 --bandwidth 264mbit -- \\
        python experiments/ps_breakdown.py --json docs/results/ps_breakdown.json
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
    ap.add_argument("--options", default="", help="ps options as in a spec, e.g. bucket_cap_mb=4")
    ap.add_argument("--no-broadcast-buffers", action="store_true", help="parallelize with broadcast_buffers=False")
    args = ap.parse_args()
    rank = join()
    import caramel
    from caramel.bench.strategies import StrategyContext, baseline_group
    from caramel.strategies import STRATEGIES
    from caramel.strategies.ps.engine import PsEngine

    med = lambda xs: round(median_ms(xs), 2)  # noqa: E731

    def fresh():
        return workload(args)

    def timed(f, reps=12):
        f()
        ts = []
        for _ in range(reps):
            dist.barrier()
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return med(ts)

    out: dict = {"format": "caramel.ps-breakdown/1", "model": args.model, "width": args.width,
                 "batch_size": args.batch_size, "steps": args.steps, "options": args.options,
                 "broadcast_buffers": not args.no_broadcast_buffers, "push": "send to the server" if
                 hasattr(PsEngine, "_send_push") else "dist.reduce",
                 "torch": torch.__version__, "bandwidth_bps": os.environ.get("CARAMEL_CLUSTER_BANDWIDTH_BPS")}
    w = fresh()
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    comp = []
    for _ in range(args.steps):
        dist.barrier()
        t = time.perf_counter()
        w.loss_fn(w.model(w.inputs), w.targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        comp.append(time.perf_counter() - t)
    out["compute_ms"] = med(comp[3:])
    nbytes = sum(p.numel() * 4 for p in w.model.parameters())
    out["param_bytes"] = nbytes
    prio_group, _ = baseline_group(StrategyContext(device=torch.device("cpu"), rank=rank, world_size=2))
    x = torch.randn(nbytes // 4)
    out["allreduce_priority_group_ms"] = timed(lambda: dist.all_reduce(x, group=prio_group))

    spec = STRATEGIES.spec("ps" + (":" + args.options if args.options else ""))
    w = fresh()
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    model, popt = caramel.parallelize(w.model, opt, "ps", options=spec.options,
                                      broadcast_buffers=not args.no_broadcast_buffers)
    run = popt.ps
    marks: dict[str, list[float]] = {}

    def mark(name, v):
        marks.setdefault(name, []).append(v)

    orig_apply, orig_shard, orig_sync = PsEngine._apply, PsEngine._step_shard, PsEngine.sync_buffers

    def sync_buffers(self):
        t = time.perf_counter()
        orig_sync(self)
        mark("forward_buffer_broadcast_ms", time.perf_counter() - t)

    def _apply(self, u):
        t = time.perf_counter()
        for wk in u.works:
            wk.wait()
        u.works = []  # waited: a gloo send or receive waited again would wait for another message
        u.used_work.wait()
        mark("wait_reductions_ms", time.perf_counter() - t)
        t = time.perf_counter()
        orig_apply(self, u)
        mark("apply_and_issue_pulls_ms", time.perf_counter() - t)

    def _step_shard(self, idx, u):
        t = time.perf_counter()
        orig_shard(self, idx, u)
        mark("shard_optimizer_ms", time.perf_counter() - t)

    PsEngine._apply, PsEngine._step_shard, PsEngine.sync_buffers = _apply, _step_shard, sync_buffers
    rows = []
    for k in range(args.steps):
        t0 = time.perf_counter()
        w0 = run.engine.wait_s
        loss = w.loss_fn(model(w.inputs), w.targets)
        t1 = time.perf_counter()
        fwd_wait = run.engine.wait_s - w0
        loss.backward()
        t2 = time.perf_counter()
        popt.step()
        popt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        rows.append({"forward_ms": t1 - t0, "forward_wait_ms": fwd_wait, "backward_ms": t2 - t1,
                     "optimizer_step_ms": t3 - t2, "step_ms": t3 - t0})
    popt.synchronize()
    PsEngine._apply, PsEngine._step_shard, PsEngine.sync_buffers = orig_apply, orig_shard, orig_sync
    skip = 3 + 2  # the two online-profiling steps, then settling
    res = {k: med([r[k] for r in rows[skip:]]) for k in rows[0]}
    res["step_mean_ms"] = round(1e3 * statistics.mean(r["step_ms"] for r in rows[skip:]), 2)
    res.update({k: med(v[skip:]) for k, v in marks.items()})
    e = run.engine
    plan = e.plan
    sizes = [sum(e.params[i].numel() * e.params[i].element_size() for i in b) for b in plan.buckets]
    res["buckets"] = len(plan.buckets)
    res["bucket_bytes"] = sizes
    res["bucket_owner"] = [plan.owner[b[0]] for b in plan.buckets]

    def pushes():
        works = [dist.reduce(torch.zeros(s // 4), dst=e.server_of(b[0]), group=e.groups.push[plan.owner[b[0]]],
                             async_op=True) for s, b in zip(sizes, plan.buckets)]
        for wk in works:
            wk.wait()

    def pulls():
        works = [dist.broadcast(torch.zeros(s // 4), src=e.server_of(b[0]), group=e.groups.pull[plan.owner[b[0]]],
                                async_op=True) for s, b in zip(sizes, plan.buckets)]
        for wk in works:
            wk.wait()

    def one(op, shard):
        def f():
            works = [op(torch.zeros(s // 4), e.server_of(b[0]), group=e.groups.push[shard], async_op=True)
                     for s, b in zip(sizes, plan.buckets) if plan.owner[b[0]] == shard]
            for wk in works:
                wk.wait()
        return f

    res["pushes_alone_ms"] = timed(pushes)
    res["pulls_alone_ms"] = timed(pulls)
    res["shard0_pushes_alone_ms"] = timed(one(dist.reduce, 0))
    res["shard0_pulls_alone_ms"] = timed(one(dist.broadcast, 0))
    out["ps"] = res
    caramel.shutdown()
    report(out, args.json)


if __name__ == "__main__":
    main()
