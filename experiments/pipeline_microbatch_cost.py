"""What a pipeline's microbatch costs beyond the profile, and what ranks waiting in transfers take.

Two parts, each in spawned processes of one compute thread (as the bench's workers):

- `overhead` (2 ranks): each rank profiles the zoo model in turns (the bench's call,
  `profile_workload`, batch b and its quarter), then the two run `caramel.pipeline` (2 stages,
  1F1B, cut before `--cut`) on a batch of 2b in 2, 4 and 8 microbatches (b, b/2, b/4 samples),
  timing every compute action on the runtime's own stage call path (`StageTimer`). Printed per
  stage and size: the measured median forward + backward per microbatch against the profile's
  line (`scaling_from_profile`, summed over the stage's layers) at that size, their difference
  (what the runtime pays per microbatch beyond the profile) and the line through the measured
  times (cost = a + b x samples); and the CPU each process spent per step beyond its timed
  compute (process CPU time, every thread, less the actions' time), per microbatch: work that
  slows nobody on two ranks of two cores but loads a shared host. Two ranks on two cores: no
  oversubscription.
- `waiting` (4 ranks): rank 0 times the whole model's forward + backward at `--probe-samples`
  while the other ranks (a) idle on a barrier, (b) block in a gloo recv, (c) one computes
  alongside, (d) one computes and two block in a recv, (e) all three compute, (f) two pass an
  activation-sized tensor back and forth over loopback (no shaping: as fast as gloo moves it),
  (g) one computes and two pass tensors. Processor sharing
  over the host's cores says how much slower each should be; a waiting rank that takes CPU
  shows as (b) above (a), (d) above (c).

    PYTHONPATH=. python experiments/pipeline_microbatch_cost.py --part overhead --json out.json
    PYTHONPATH=. python experiments/pipeline_microbatch_cost.py --part waiting --json out.json

It never hangs (it runs under the bench's lock): the process group and the barrier time out
after `WAIT_S`, a worker that dies or overruns `RUN_S` ends the others, and the file store is
deleted on the way out.
"""
from __future__ import annotations

import argparse
import os
import queue as queues
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WAIT_S = 300  # the longest a rank waits for the others (a turn's profile, a mode's probe take seconds)
RUN_S = 1800  # the longest a part runs


def _workload(args, batch: int, seed: int = 0):
    from caramel.models.zoo import get_model

    options = dict(kv.split("=", 1) for kv in args.model_option)
    options = {k: int(v) if v.isdigit() else v for k, v in options.items()}
    return get_model(args.model)(seed=seed, batch_size=batch, **options)


def _profile_stage_costs(profile, cut: str, sizes: list[int]) -> dict:
    """The profile's line per stage (fixed, per sample) and its forward + backward at each size."""
    from caramel.strategies.pipeline.profile_costs import scaling_from_profile

    names, layers = scaling_from_profile(profile)
    k = names.index(cut)
    out = {}
    for stage, group in enumerate((layers[:k], layers[k:])):
        fixed = sum(c.fixed_forward_s + c.fixed_backward_s for c in group)
        slope = sum(c.per_sample_forward_s + c.per_sample_backward_s for c in group)
        out[stage] = {"fixed_s": fixed, "per_sample_s": slope,
                      "at_s": {s: sum(c.at(s).compute_s for c in group) for s in sizes}}
    return out


def _overhead_worker(rank: int, args, store: str, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=WAIT_S))
    import caramel
    from caramel.bench.lower_bound import profile_workload

    b = args.batch_size
    sizes = [b, b // 2, b // 4]
    profiles = []
    for rep in range(args.repeats):  # in turns: the other rank waits on the barrier
        for turn in range(2):
            if turn == rank:
                profiles.append(profile_workload(_workload(args, b, seed=rep), small_batch_size=b // 4))
            dist.barrier()
    costs = [_profile_stage_costs(p, args.cut, sizes) for p in profiles]
    measured: dict[int, dict[str, list[float]]] = {}
    for rep in range(args.repeats):
        for m in (2, 4, 8):
            w = _workload(args, 2 * b, seed=rep)
            opt = torch.optim.SGD(w.model.parameters(), lr=0.01)
            pipe = caramel.pipeline(w.model, opt, stages=2, microbatches=m, schedule="1f1b", partition=args.cut)
            cpu_s = []
            for _ in range(args.steps + 2):
                c = time.process_time()  # every thread of the process: gloo's included
                pipe.step(w.inputs, w.targets, w.loss_fn)
                cpu_s.append(time.process_time() - c)
            dist.barrier()
            per = {"F": [], "B": []}
            for st in pipe.timer.steps[2:]:
                for kind, _, _, a, e in st.actions:
                    per[kind].append(e - a)
            # the last stage's loss is timed as its own "F" action: fold it into the forward per microbatch
            f_total = sum(per["F"]) / len(pipe.timer.steps[2:]) / m
            b_med = statistics.median(per["B"])
            row = measured.setdefault(2 * b // m, {"fb_s": [], "outside_cpu_per_mb_s": []})
            row["fb_s"].append(f_total + b_med)
            # CPU the process spent in a step beyond its timed compute, per microbatch
            kept = list(zip(cpu_s[-args.steps:], pipe.timer.steps[-args.steps:]))
            row["outside_cpu_per_mb_s"].append(statistics.median((c - st.busy_s) / m for c, st in kept))
            pipe.close()
    queue.put((rank, {"profile": costs, "measured": measured}))
    dist.barrier()
    dist.destroy_process_group()


def _probe(w, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        w.loss_fn(w.model(w.inputs), w.targets).backward()
        out.append(time.perf_counter() - t)
    return out


def _waiting_worker(rank: int, args, barrier, stop, store: str, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4,
                            timeout=timedelta(seconds=WAIT_S))
    w = _workload(args, args.probe_samples)
    _probe(w, 2)
    modes = {"idle": (), "recv_wait": (), "compute1": (1,), "compute1_recv_wait2": (1,), "compute3": (1, 2, 3),
             "transfer2": (), "compute1_transfer2": (1,)}
    moving = {"transfer2": (2, 3), "compute1_transfer2": (2, 3)}  # a pair sending to each other back and forth
    activation = torch.zeros(args.transfer_floats)
    waits = {"recv_wait": (1, 2, 3), "compute1_recv_wait2": (2, 3)}
    rows = []
    for rep in range(args.repeats):
        for mode, computing in modes.items():
            barrier.wait()
            if rank == 0:
                time.sleep(0.2)  # the others are in place (a recv posted, a loop started)
                times = _probe(w, args.reps)
                rows.append({"mode": mode, "repeat": rep, "median_s": statistics.median(times)})
                for r in waits.get(mode, ()):
                    dist.send(torch.zeros(1), dst=r)
                stop.set()
            elif rank in waits.get(mode, ()):
                dist.recv(torch.zeros(1), src=0)
            elif rank in computing:
                while not stop.is_set():
                    _probe(w, 1)
            elif rank in moving.get(mode, ()):
                pair = moving[mode]
                other = pair[1] if rank == pair[0] else pair[0]
                go = torch.ones(1)
                while go.item():  # the first of the pair decides when to stop, and says so with each round
                    if rank == pair[0]:
                        go.fill_(0.0 if stop.is_set() else 1.0)
                        dist.send(go, dst=other)
                        dist.send(activation, dst=other)
                        dist.recv(activation, src=other)
                    else:
                        dist.recv(go, src=other)
                        dist.recv(activation, src=other)
                        dist.send(activation, dst=other)
            barrier.wait()
            if rank == 0:
                stop.clear()  # the others wait on the next mode's first barrier meanwhile
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def _line(points: dict[int, float]) -> tuple[float, float]:
    xs, ys = list(points), [points[x] for x in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def _gather(ctx, target, world: int, extra: tuple, answers: int) -> list:
    """Run `target(rank, *extra, store, queue)` on `world` spawned ranks and collect `answers`
    items from the queue. A rank that exits with an error, or a part that overruns `RUN_S`, is
    an error; whatever happens, the ranks still alive are ended and the store is deleted."""
    tmp = tempfile.mkdtemp(prefix="mbcost_")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *extra, os.path.join(tmp, "store"), queue)) for r in range(world)]
    try:
        for p in procs:
            p.start()
        out, deadline = [], time.monotonic() + RUN_S
        while len(out) < answers:
            try:
                out.append(queue.get(timeout=1.0))
            except queues.Empty:
                failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"rank(s) {failed} failed (exit codes {[procs[r].exitcode for r in failed]})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no result after {RUN_S} s")
        for p in procs:
            p.join(WAIT_S)
        return out
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            if p.pid is not None:
                p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(tmp, ignore_errors=True)


def overhead(args) -> dict:
    parts = dict(_gather(mp.get_context("spawn"), _overhead_worker, 2, (args,), 2))
    out = {}
    for stage in (0, 1):
        costs = parts[stage]["profile"]
        meas = {s: statistics.median(v["fb_s"]) for s, v in parts[stage]["measured"].items()}
        prof = {s: statistics.median(c[stage]["at_s"][s] for c in costs) for s in meas}
        fixed = statistics.median(c[stage]["fixed_s"] for c in costs)
        slope = statistics.median(c[stage]["per_sample_s"] for c in costs)
        a, b = _line(meas)
        outside = {s: statistics.median(v["outside_cpu_per_mb_s"]) for s, v in parts[stage]["measured"].items()}
        print(f"stage {stage}: CPU outside the timed compute per microbatch (process, all threads): "
              + ", ".join(f"{s} samples {1e3 * outside[s]:.2f} ms" for s in sorted(outside, reverse=True)))
        print(f"stage {stage}: profile line {1e3 * fixed:.2f} ms + {1e3 * slope:.2f} ms/sample; "
              f"measured line {1e3 * a:.2f} ms + {1e3 * b:.2f} ms/sample")
        for s in sorted(meas, reverse=True):
            print(f"  {s:3d} samples: measured fwd+bwd {1e3 * meas[s]:6.2f} ms, profile {1e3 * prof[s]:6.2f} ms, "
                  f"beyond {1e3 * (meas[s] - prof[s]):+6.2f} ms ({meas[s] / prof[s]:.2f}x)")
        out[stage] = {"measured_s": meas, "profile_s": prof, "profile_fixed_s": fixed, "profile_per_sample_s": slope,
                      "measured_fixed_s": a, "measured_per_sample_s": b,
                      "outside_cpu_per_microbatch_s": outside, "raw": parts[stage]}
    return out


def waiting(args) -> dict:
    ctx = mp.get_context("spawn")
    barrier, stop = ctx.Barrier(4, timeout=WAIT_S), ctx.Event()
    rows = _gather(ctx, _waiting_worker, 4, (args, barrier, stop), 1)[0]
    base = statistics.median(r["median_s"] for r in rows if r["mode"] == "idle")
    out = {"rows": rows, "ratio_to_idle": {}}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        med = statistics.median(r["median_s"] for r in rows if r["mode"] == mode)
        out["ratio_to_idle"][mode] = med / base
        print(f"{mode:22s}: median {1e3 * med:6.2f} ms ({med / base:.2f}x idle)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("overhead", "waiting"), required=True)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--model-option", action="append", default=None, metavar="KEY=VALUE",
                   help="a zoo model option, repeatable (default: width=16 when none is given)")
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--cut", default="layer3")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--probe-samples", type=int, default=6)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--transfer-floats", type=int, default=6 * 32 * 16 * 16,
                   help="elements of the tensor a transferring pair passes back and forth (default: ResNet-18 width 16's "
                        "activation before layer3 at 6 samples: 32 channels of 16x16, float32)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.model_option = args.model_option or ["width=16"]
    bad = [o for o in args.model_option if "=" not in o or not o.split("=", 1)[0]]
    if bad:
        p.error(f"--model-option must be KEY=VALUE, got {bad}")
    if args.batch_size < 4 or args.batch_size % 4:
        p.error(f"--batch-size must be a positive multiple of 4 (microbatches of b, b/2 and b/4 samples), "
                f"got {args.batch_size}")
    for name in ("steps", "repeats", "probe_samples", "reps", "transfer_floats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    t0 = time.time()
    out = overhead(args) if args.part == "overhead" else waiting(args)
    print(f"wall {time.time() - t0:.1f} s; cpu_count {os.cpu_count()}; load {os.getloadavg()}")
    if args.json:
        from caramel.jsonio import format_tag, write_json
        write_json(args.json, {"format": format_tag("pipeline-microbatch-cost"), "args": vars(args),
                               "cpu_count": os.cpu_count(), "result": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
