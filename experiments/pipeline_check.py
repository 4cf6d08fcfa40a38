"""Pipeline on loopback: measured step time, slowest stage and bubble against the simulator's.

Two workers (`caramel.testing.run_workers`, gloo on loopback, one thread each) train `big_fc`
with each schedule, interleaved round by round with DDP on the same samples per step. Per
schedule: the median step time; each stage's compute alone (its forward and backward on the
microbatches, no communication), the slowest of which is the measured slowest stage; the
measured bubble `1 - compute / step`. Rank 0 profiles the model and asks the simulator
(`simulate_pipeline`, the partition the runtime chose) for the same numbers; "replay" runs the
simulator's schedule model on this run's measured stage compute instead of the profile's.

    python experiments/pipeline_check.py --steps 10 --microbatches 4
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SCHEDULES = ("gpipe", "1f1b", "pipedream")


def make(model: str, seed: int, batch: int):
    """`big_fc` from the zoo, or `chain`: 8 equal 512-wide linear layers (balanced stages)."""
    from caramel.models import get_model
    from caramel.models.zoo import ModelBatch

    if model == "big_fc":
        return get_model("big_fc")(batch_size=batch, seed=seed)
    torch.manual_seed(0)
    layers = [m for _ in range(8) for m in (torch.nn.Linear(512, 512), torch.nn.Tanh())]
    net = torch.nn.Sequential(*layers[:-1])
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, 512, generator=g)
    return ModelBatch("chain", net, x, torch.randint(0, 512, (batch,), generator=g), F.cross_entropy)


def _stage_compute_s(pipe, model, x, microbatches: int, reps: int = 5) -> float:
    """This rank's stage alone: forward and backward of each microbatch, no communication."""
    stage = pipe.stage_modules[0]
    first = int(next(iter(stage._modules)))  # the stage keeps the model's layer names
    with torch.no_grad():
        h = x
        for layer in list(model.children())[:first]:
            h = layer(h)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for mb in h.chunk(microbatches):
            mb = mb.detach().requires_grad_(first > 0)
            stage(mb).float().pow(2).mean().backward()
        times.append(time.perf_counter() - t0)
    stage.zero_grad(set_to_none=True)
    return statistics.median(times)


def worker(rank: int, world: int, steps: int, microbatches: int, model_name: str) -> dict:
    import caramel

    out: dict = {}
    w = make(model_name, rank, 16)
    x, y = torch.cat([w.inputs] * world), torch.cat([w.targets] * world)  # DDP's samples per step
    runners = {}
    for sched in SCHEDULES:
        m = make(model_name, 0, 16).model
        runners[sched] = (caramel.pipeline(m, lambda ps: torch.optim.SGD(ps, lr=0.01), stages=world,
                                           microbatches=microbatches, schedule=sched), m)
    ddp_model = torch.nn.parallel.DistributedDataParallel(make(model_name, 0, 16).model)
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

    def ddp_step():
        F.cross_entropy(ddp_model(w.inputs), w.targets).backward()
        ddp_opt.step()
        ddp_opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {k: [] for k in (*SCHEDULES, "ddp")}
    for step in range(steps + 2):  # two warm-up rounds
        for name in times:
            torch.distributed.barrier()
            t0 = time.perf_counter()
            if name == "ddp":
                ddp_step()
            else:
                runners[name][0].step(x, y, F.cross_entropy)
            if step >= 2:
                times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        out[name] = {"step_s": statistics.median(ts)}
    for sched, (pipe, model) in runners.items():
        out[sched]["stage_compute_s"] = _stage_compute_s(pipe, model, x, microbatches)
        out[sched]["boundaries"] = pipe.boundaries
        out[sched]["predicted_slowest_per_mb_s"] = pipe.partition.slowest_s if pipe.partition else None
    if rank == 0:
        from caramel.profile.profiler import profile_model
        from caramel.strategies.pipeline.options import PipelineOptions
        from caramel.strategies.pipeline.simulate import simulate_pipeline
        from caramel.topology.spec import ClusterSpec

        prof = profile_model(make(model_name, 0, 16).model, w.inputs, w.targets, F.cross_entropy,
                             steps=3)
        cluster = ClusterSpec.uniform(world, 10e9)
        for sched in SCHEDULES:
            b = runners[sched][0].boundaries
            sim = simulate_pipeline(prof, cluster, PipelineOptions(stages=world, microbatches=microbatches,
                                                                   schedule=sched, partition="+".join(map(str, b))))
            out[sched]["sim_step_s"] = sim.step_time_s
            out[sched]["sim_bubble"] = sim.meta["bubble_fraction"]
    return out


def main() -> None:
    from caramel.testing import run_workers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", choices=("big_fc", "chain"), default="big_fc")
    args = ap.parse_args()
    ranks = run_workers(worker, args.workers, args=(args.steps, args.microbatches, args.model), timeout_s=300)
    p, m = args.workers, args.microbatches
    print(f"{args.model}, {p} workers on loopback, {m} microbatches, batch {16 * p} per pipeline step")
    from caramel.strategies.pipeline.replay import replay, schedule_actions
    from caramel.strategies.pipeline.simulate import StageCosts

    print(f"{'strategy':10} {'step ms':>8} {'sim ms':>8} {'replay ms':>9} {'slowest stage ms':>17} {'bubble':>7} "
          f"{'sim bubble':>10} {'(p-1)/(m+p-1)':>13}")
    for name in (*SCHEDULES, "ddp"):
        step = max(r[name]["step_s"] for r in ranks)
        if name == "ddp":
            print(f"{name:10} {1e3 * step:8.1f}")
            continue
        slowest = max(r[name]["stage_compute_s"] for r in ranks)
        bubble = 1 - sum(r[name]["stage_compute_s"] for r in ranks) / (p * step)
        r0 = ranks[0][name]
        # the schedule model alone: this run's measured stage compute (backward = 2 x forward), no link
        per_mb = [r[name]["stage_compute_s"] / m for r in ranks]
        rep = replay(StageCosts([t / 3 for t in per_mb], [2 * t / 3 for t in per_mb], [0.0] * (p - 1)),
                     schedule_actions(name, p, p, m)).step_time_s
        print(f"{name:10} {1e3 * step:8.1f} {1e3 * r0['sim_step_s']:8.1f} {1e3 * rep:9.1f} {1e3 * slowest:17.1f} {bubble:7.2f} "
              f"{r0['sim_bubble']:10.2f} {(p - 1) / (m + p - 1):13.2f}   cut {r0['boundaries']}")
    print(json.dumps(ranks[0], default=str))


if __name__ == "__main__":
    main()
