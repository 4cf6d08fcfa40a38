"""Where the ps strategy's step goes on the emulated cluster, against what its model assumes.

The bench's ps model (`caramel.strategies.ps.simulate`) predicts the colocated bsp parameter
server below its measured step. This times, on any number of workers, in one process:

- the compute-only step (no communication), as the bench's baseline, and an all-reduce of the
  model's gradient bytes on a group like the comm-only baseline's (`baseline_group`);
- the plan's pushes alone (each bucket sent to its shard's server as the engine does, every shard's
  sequence on its own push group, side by side) and its pulls alone (one `dist.broadcast` per
  bucket), with nothing else running;
- ps steps through `caramel.parallelize`: the forward (and its wait for pulls), backward, and
  `optimizer.step()` split into the wait for the step's reductions, the shard's optimizer
  and the rest (pushes of what never became ready, the used-count all-reduce, pull hand-over);
  per rank, the median time into the step of each event (each bucket
  handed over, each push or receive done, the used count in, the pulls issued), and the CPU
  time of a step;
- the model's account of the same step (`meta.pieces_s`, `meta.timeline_s`), replayed on a
  profile taken in this job with the bench's traffic probe (`caramel.bench.traffic_probe`),
  and without the probe's inputs.

    caramel cluster run --workers 2 --bandwidth 264mbit -- \\
        python experiments/ps_breakdown.py --json docs/results/ps_breakdown.json

`--latency` (the model's latency per transfer) takes its unit, s, ms or us, as the cluster's own
`--latency` does: a bare `0.00035` is refused rather than read as seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.units import parse_duration_arg_s
from experiments.cluster_job import join, median_ms, model_arguments, report, workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, steps=25)
    ap.add_argument("--options", default="", help="ps options as in a spec, e.g. bucket_cap_mb=4")
    ap.add_argument("--no-broadcast-buffers", action="store_true", help="parallelize with broadcast_buffers=False")
    ap.add_argument("--slowdown", type=float, default=1.0,
                    help="compute's slowdown beside the transfers for the model's account "
                         "(the bench's concurrent baseline)")
    ap.add_argument("--latency", default=None,
                    help="latency per transfer for the model's account, with its unit (350us, 0.6ms)")
    args = ap.parse_args()
    try:  # before joining, so that every rank refuses it alike
        latency_s = None if args.latency is None else parse_duration_arg_s(args.latency, "--latency")
    except CaramelError as e:
        ap.error(str(e))
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
    world = dist.get_world_size()
    w = fresh()
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    comp, comp_cpu = [], []
    for _ in range(args.steps):
        dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        w.loss_fn(w.model(w.inputs), w.targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        comp.append(time.perf_counter() - t)
        comp_cpu.append(time.process_time() - c)
    out["compute_ms"] = med(comp[3:])
    out["compute_cpu_ms"] = med(comp_cpu[3:])  # this process's CPU time (all its threads) per step
    nbytes = sum(p.numel() * 4 for p in w.model.parameters())
    out["param_bytes"] = nbytes
    prio_group, _ = baseline_group(StrategyContext(device=torch.device("cpu"), rank=rank, world_size=world))
    x = torch.randn(nbytes // 4)
    out["allreduce_priority_group_ms"] = timed(lambda: dist.all_reduce(x, group=prio_group))
    # the model's inputs, as the bench takes them: a profile taken on every rank at once, each
    # rank's compute-only median, the rate the all-reduce achieved
    from caramel.bench.lower_bound import effective_bandwidth_bps, profile_workload

    profile = profile_workload(fresh())
    from caramel.bench.traffic_probe import efficiency, probe_traffic

    traffic = probe_traffic(nbytes, torch.device("cpu"), world)
    medians: list = [None] * world
    dist.all_gather_object(medians, median_ms(comp[3:]) / 1e3)

    spec = STRATEGIES.spec("ps" + (":" + args.options if args.options else ""))
    w = fresh()
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    model, popt = caramel.parallelize(w.model, opt, "ps", options=spec.options,
                                      broadcast_buffers=not args.no_broadcast_buffers)
    run = popt.ps
    marks: dict[str, list[float]] = {}

    def mark(name, v):
        marks.setdefault(name, []).append(v)

    # this step's events, in ms from its start (the forward's): what happened when, on this rank
    events: list[dict[str, float]] = []

    def event(name):
        events[-1].setdefault(name, 1e3 * (time.perf_counter() - events[-1]["t0"]))

    # buffers travel through the engine's BufferSync, sent early at step() (no forward broadcast to time)
    orig_apply, orig_shard = PsEngine._apply, PsEngine._step_shard
    orig_push, orig_catch = PsEngine._push, PsEngine.catch_up

    def _push(self, b):
        event(f"handed_{b}")
        orig_push(self, b)

    def catch_up(self, idx, required=None, forward=False):
        waited = orig_catch(self, idx, required, forward)
        if forward:
            event("first_module_ready")
            if waited > 0:  # the latest, not the first
                events[-1]["last_forward_wait_end"] = 1e3 * (time.perf_counter() - events[-1]["t0"])
        return waited

    def _apply(self, u):
        t = time.perf_counter()
        event("step_called")
        for j, wk in enumerate(u.works):
            wk.wait()
            event(f"work_{j}_waited")
        u.works = []  # waited: a gloo send or receive waited again would wait for another message
        u.used_work.wait()
        event("used_count_in")
        mark("wait_reductions_ms", time.perf_counter() - t)
        t = time.perf_counter()
        orig_apply(self, u)
        event("pulls_issued")
        mark("apply_and_issue_pulls_ms", time.perf_counter() - t)

    def _step_shard(self, idx, u):
        t = time.perf_counter()
        orig_shard(self, idx, u)
        mark("shard_optimizer_ms", time.perf_counter() - t)

    PsEngine._apply, PsEngine._step_shard = _apply, _step_shard
    PsEngine._push, PsEngine.catch_up = _push, catch_up
    rows = []
    for k in range(args.steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        events.append({"t0": t0})
        w0 = run.engine.wait_s
        loss = w.loss_fn(model(w.inputs), w.targets)
        t1 = time.perf_counter()
        fwd_wait = run.engine.wait_s - w0
        loss.backward()
        t2 = time.perf_counter()
        event("backward_end")
        popt.step()
        popt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        rows.append({"forward_ms": t1 - t0, "forward_wait_ms": fwd_wait, "backward_ms": t2 - t1,
                     "optimizer_step_ms": t3 - t2, "step_ms": t3 - t0, "step_cpu_ms": time.process_time() - c0})
    popt.synchronize()
    PsEngine._apply, PsEngine._step_shard = orig_apply, orig_shard
    PsEngine._push, PsEngine.catch_up = orig_push, orig_catch
    skip = 3 + 2  # the two online-profiling steps, then settling
    res = {k: med([r[k] for r in rows[skip:]]) for k in rows[0]}
    res["step_mean_ms"] = round(1e3 * statistics.mean(r["step_ms"] for r in rows[skip:]), 2)
    res.update({k: med(v[skip:]) for k, v in marks.items()})
    mine = {}
    for ev in events[skip:]:
        for k, v in ev.items():
            if k != "t0":
                mine.setdefault(k, []).append(v)
    per_rank: list = [None] * world
    ordered = sorted(mine.items(), key=lambda kv: statistics.median(kv[1]))  # in the order they happen
    dist.all_gather_object(per_rank, {k: round(statistics.median(v), 2) for k, v in ordered})
    res["timeline_ms_per_rank"] = per_rank
    e = run.engine
    plan = e.plan
    sizes = [sum(e.params[i].numel() * e.params[i].element_size() for i in b) for b in plan.buckets]
    res["buckets"] = len(plan.buckets)
    res["bucket_bytes"] = sizes
    res["bucket_owner"] = [plan.owner[b[0]] for b in plan.buckets]

    def send_push(s, b):
        """One bucket's push as the engine makes it (`PsEngine._send_push`)."""
        server, group = e.server_of(b[0]), e.groups.push[plan.owner[b[0]]]
        if server != e.rank:
            return [dist.isend(torch.zeros(s // 4), server, group=group)]
        return [dist.irecv(torch.empty(s // 4), j, group=group) for j in range(world) if j != e.rank]

    def pushes(shards=None):
        works = [wk for s, b in zip(sizes, plan.buckets) if shards is None or plan.owner[b[0]] in shards
                 for wk in send_push(s, b)]
        for wk in works:
            wk.wait()

    def pulls():
        works = [dist.broadcast(torch.zeros(s // 4), src=e.server_of(b[0]), group=e.groups.pull[plan.owner[b[0]]],
                                async_op=True) for s, b in zip(sizes, plan.buckets)]
        for wk in works:
            wk.wait()

    def shard0_pulls():
        works = [dist.broadcast(torch.zeros(s // 4), src=e.server_of(b[0]), group=e.groups.pull[0], async_op=True)
                 for s, b in zip(sizes, plan.buckets) if plan.owner[b[0]] == 0]
        for wk in works:
            wk.wait()

    res["pushes_alone_ms"] = timed(pushes)
    res["pulls_alone_ms"] = timed(pulls)
    res["shard0_pushes_alone_ms"] = timed(lambda: pushes({0}))
    res["shard0_pulls_alone_ms"] = timed(shard0_pulls)
    out["ps"] = res
    # the model's account of the same step, piece by piece
    from caramel.bench.prediction import bench_cluster, worker_speeds
    from caramel.strategies.ps.simulate import simulate_ps

    rate = effective_bandwidth_bps(nbytes, world, out["allreduce_priority_group_ms"] / 1e3)
    cluster = bench_cluster(world, rate, worker_speeds(profile.step_time_s, medians),
                            {"latency_s": latency_s} if latency_s is not None else None, args.slowdown)
    bare = simulate_ps(profile, cluster, spec.options)  # without the traffic probe's inputs
    cluster.meta.update({"link_queue_s": traffic["queue_s"],
                         "push_efficiency": efficiency(traffic, "all_to_all", world, rate),
                         "pull_efficiency": efficiency(traffic, "broadcasts", world, rate)})
    sim = simulate_ps(profile, cluster, spec.options)
    out["model"] = {"rate_bps": rate, "slowdown": args.slowdown, "latency_s": cluster.latency_s,
                    "traffic": traffic, **{k: cluster.meta[k] for k in ("link_queue_s", "push_efficiency", "pull_efficiency")},
                    "profile_ms": {"forward": profile.forward_time_s * 1e3, "backward": profile.backward_time_s * 1e3,
                                   "optimizer": profile.optimizer_time_s * 1e3},
                    "step_without_traffic_ms": bare.step_time_s * 1e3,
                    "step_ms": sim.step_time_s * 1e3, **{k + "_ms": v * 1e3 for k, v in sim.meta["pieces_s"].items()},
                    "timeline_ms": _ms(sim.meta["timeline_s"]), "rank_compute_s": medians,
                    "profile": profile.to_dict()}  # to replay the model on
    caramel.shutdown()
    report(out, args.json)


def _ms(x):
    """Seconds to ms (rounded), through lists, tuples and dicts; ints (bucket ids) as they are."""
    if isinstance(x, dict):
        return {k: _ms(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_ms(v) for v in x]
    return round(x * 1e3, 2) if isinstance(x, float) else x


if __name__ == "__main__":
    main()
