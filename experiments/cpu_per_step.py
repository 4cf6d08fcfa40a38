"""CPU time per step: where a strategy's CPU goes on a host whose cores also run the network.

Run on every worker of an emulated cluster (as root):

    caramel cluster run --workers 4 --bandwidth 500mbit -- python experiments/cpu_per_step.py forward
    caramel cluster run --workers 2 --bandwidth 500mbit -- python experiments/cpu_per_step.py comm:7

Modes: `compute` (no communication), `ddp` (torch DDP, default settings), `forward` /
`backward` (the engine with that overlap; `forward:normal` for communication threads at normal
priority), and `comm:N` (ResNet-18 width 16's 2.8 MB of gradients all-reduced alone, as N
collectives one after another; `comm:1` as one). Each rank prints its wall time per step, its
process CPU time per step (`time.process_time`: every thread, the kernel's work on their
behalf included), its main thread's (`time.thread_time`) and the host's busy cores over the
same steps (`/proc/stat`); rank 0 also prints the engine's plan. docs/engine.md, "Each
collective's CPU time", holds the numbers this measured.
"""
from __future__ import annotations

import argparse
import time

SIZES_MB = (0.60, 0.59, 0.62, 0.44, 0.38, 0.13, 0.04)  # a 7-bucket plan of ResNet-18 width 16


def _host_busy() -> list[int]:
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def _training_step(mode: str, rank: int):
    import torch

    from caramel.models.zoo import resnet18
    from caramel.strategies.api import parallelize

    w = resnet18(batch_size=8, width=16, seed=rank)
    model, opt = w.model, torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif mode != "compute":
        overlap, _, priority = mode.partition(":")
        model, opt = parallelize(model, opt, overlap=overlap, comm_priority=priority or "auto")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        w.loss_fn(model(w.inputs), w.targets).backward()
        opt.step()
    return step, opt


def _comm_step(pieces: int):
    import torch
    import torch.distributed as dist

    total = sum(SIZES_MB)
    sizes = SIZES_MB if pieces == len(SIZES_MB) else [total / pieces] * pieces
    bufs = [torch.ones(int(s * 1e6 / 4)) for s in sizes]

    def step() -> None:
        for b in bufs:
            dist.all_reduce(b)
    return step, None


def main() -> None:
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", help="compute, ddp, forward, backward, forward:normal, backward:normal or comm:N")
    p.add_argument("--steps", type=int, default=40, help="measured steps (default 40)")
    p.add_argument("--warmup", type=int, default=25, help="steps before measuring (default 25: the engine profiles, plans and tries its modes)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode.startswith("comm:"):
        step, opt = _comm_step(int(args.mode.split(":")[1]))
    else:
        step, opt = _training_step(args.mode, rank)
    for _ in range(args.warmup):
        step()
    dist.barrier()
    s0, c0, m0, t0 = _host_busy(), time.process_time(), time.thread_time(), time.perf_counter()
    for _ in range(args.steps):
        step()
    s1, c1, m1, t1 = _host_busy(), time.process_time(), time.thread_time(), time.perf_counter()
    d = [b - a for a, b in zip(s0, s1)]
    total, idle = sum(d), d[3] + d[4]
    cores = len([line for line in open("/proc/stat") if line.startswith("cpu") and line[3].isdigit()])
    n = args.steps
    print(f"{args.mode} rank {rank}: step {(t1 - t0) / n * 1e3:.1f} ms, process CPU {(c1 - c0) / n * 1e3:.1f} ms, "
          f"main thread {(m1 - m0) / n * 1e3:.1f} ms; host busy {(total - idle) / total * cores:.2f} of {cores} cores "
          f"(user {d[0] / total * cores:.2f}, system {d[2] / total * cores:.2f}, softirq {d[6] / total * cores:.2f})",
          flush=True)
    if opt is not None and hasattr(opt, "synchronize"):
        opt.synchronize()
        plan = opt.engine.plan
        if rank == 0 and plan is not None:
            print(f"plan: {len(plan.buckets)} buckets, {plan.num_items()} collectives, order "
                  f"{plan.options.get('order')}, overlap {opt.engine.overlap}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
