"""What a strategy costs besides the network: 2 workers on loopback, every strategy built as the
bench builds it, its gradient collectives made no-ops (torch's `noop_hook` for DDP,
`caramel.strategies.caramel.parallelize.mute_gradient_communication` for the engine), timed in interleaved rounds
beside the plain training step. Prints, per rank, each strategy's median step minus the plain
step's.

    python experiments/muted_cost.py --model resnet18 --rounds 12 --steps 4

Strategies (`--strategies`, comma-separated): `ddp`, `fifo/<overlap>[@<bucket MB>]` and
`caramel/<overlap>`; a `-nobuf` suffix turns the per-forward buffer broadcast off.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

DEFAULT = "ddp,ddp-nobuf,fifo/backward,caramel/forward,caramel/forward-nobuf,caramel/backward"


def _build(name: str, w, profile, world: int):
    import torch

    import caramel
    from caramel.topology.spec import ClusterSpec
    from caramel.strategies.planners import make_plan
    from experiments.validation.calibrate import mute

    model = copy.deepcopy(w.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    spec, buffers = (name[:-len("-nobuf")], False) if name.endswith("-nobuf") else (name, True)
    if spec == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # the flag only when off: torch warns that it is deprecated (the engine does the same)
        ddp = DistributedDataParallel(model, **({} if buffers else {"broadcast_buffers": False}))
        mute("ddp", ddp, opt)
        return ddp, opt, 0
    planner, _, rest = spec.partition("/")
    overlap, _, cap = rest.partition("@")
    options = {"overlap": overlap} if planner == "caramel" else {}
    if cap:
        options.update(bucket_cap_mb=float(cap), first_bucket_mb=float(cap))
    plan = make_plan(planner, profile, ClusterSpec.uniform(world, 500e6, 1e-4), **options)
    wrapped, opt = caramel.parallelize(model, opt, plan=plan, overlap=overlap, broadcast_buffers=buffers)
    mute(planner, wrapped, opt)
    return wrapped, opt, len(plan.buckets)


def worker(rank: int, world: int, model_name: str, batch: int, strategies: list[str], rounds: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    import caramel
    from caramel.bench.harness import round_order
    from caramel.models import get_model

    torch.set_num_threads(1)
    kwargs = {"width": 16} if model_name == "resnet18" else {}
    w = get_model(model_name)(batch_size=batch, seed=0, **kwargs)
    m = copy.deepcopy(w.model)
    # every rank plans from rank 0's profile, so that all hold the same plan
    box = [caramel.profile_model(m, w.inputs, w.targets, w.loss_fn, steps=3, name=model_name) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    plain_model = copy.deepcopy(w.model)
    runners = {"plain": (plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.01, momentum=0.9), 0)}
    for name in strategies:
        runners[name] = _build(name, w, box[0], world)
    times: dict[str, list[float]] = {k: [] for k in runners}

    def run(name: str, n: int, record: bool) -> None:
        model, opt, _ = runners[name]
        for _ in range(n):
            t0 = time.perf_counter()
            w.loss_fn(model(w.inputs), w.targets).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if record:
                times[name].append(time.perf_counter() - t0)
        if hasattr(opt, "synchronize"):
            opt.synchronize()

    keys = list(runners)
    for k in keys:
        run(k, 2, record=False)
    for r in range(rounds):
        for k in round_order(keys, r):
            dist.barrier()
            run(k, steps, record=True)
    plain = statistics.median(times["plain"])
    return {"plain_s": plain, "extra_s": {k: statistics.median(v) - plain for k, v in times.items() if k != "plain"},
            "buckets": {k: runners[k][2] for k in strategies}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--strategies", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    from caramel.testing import run_workers

    strategies = [s for s in args.strategies.split(",") if s]
    res = run_workers(worker, 2, args=(args.model, args.batch_size, strategies, args.rounds, args.steps),
                      timeout_s=3000, collective_timeout_s=600)
    print(f"{args.model}: each strategy's step with its gradient communication muted, minus the plain step")
    print("| strategy | buckets | " + " | ".join(f"rank {r} (plain {x['plain_s'] * 1e3:.1f} ms)" for r, x in enumerate(res)) + " |")
    print("|---|---:|" + "---:|" * len(res))
    for name in strategies:
        print(f"| {name} | {res[0]['buckets'][name] or '-'} | " + " | ".join(f"{x['extra_s'][name] * 1e3:+.1f} ms" for x in res) + " |")


if __name__ == "__main__":
    main()
