"""What a validation job measures before it predicts: calibration, never fitted to the timed steps.

Measured per model on the cluster as it is shaped for each bandwidth, every rank at once,
before any configuration is timed:

- `measure_slowdown`: how much slower the model's step runs while all-reduces stream beside it
  (the event engine's `compute_slowdown`, part of the headline prediction);
- `measure_compute`: each configuration's own step with its gradient communication muted, timed
  beside the plain step. The profile says how compute is spread over the layers; these say how
  long a step takes at that moment, plain and as the strategy runs it (DDP's reducer, the
  engine's hooks, bucket copies and lazy updates, the buffer broadcast before every forward and
  the wait for the slower peer that it brings). The headline prediction replays the profile at
  the plain step's length; the muted step feeds an alternative (`validate_worker.predict`).

The builders the job times with live here too (`workload`, `build_runner`), so that what is
calibrated is what is timed.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

def workload(job: dict[str, Any], device: torch.device):
    """A fresh copy of the job's model, batch and loss on `device` (the same on every rank)."""
    from caramel.models.zoo import get_model

    w = get_model(job["model"])(seed=job["seed"], batch_size=job["batch_size"], **job["model_options"])
    w.model.to(device)
    w.inputs, w.targets = w.inputs.to(device), w.targets.to(device)
    return w


def sgd(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """The optimizer every validation step uses."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def build_runner(cfg: dict[str, Any], plan, job: dict[str, Any], device: torch.device, timeout_s: float):
    """Configuration `cfg` built exactly as it is timed: torch DDP, or `caramel.parallelize` running `plan`."""
    import caramel
    from caramel.bench.strategies import TrainRunner

    w = workload(job, device)
    opt = sgd(w.model, job["lr"])
    name = cfg["name"]
    if cfg["planner"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(w.model, **cfg["options"])
        return TrainRunner(name, wrapped, opt, w.inputs, w.targets, w.loss_fn, device)
    wrapped, opt = caramel.parallelize(w.model, opt, plan=plan, overlap=cfg["overlap"], timeout_s=timeout_s)
    return TrainRunner(name, wrapped, opt, w.inputs, w.targets, w.loss_fn, device, finish=opt.synchronize,
                       stats=opt.engine.stats_dict)


def train_step(w, opt):
    """One plain training step of workload `w` (the compute the interference measurements time)."""
    def step() -> None:
        w.loss_fn(w.model(w.inputs), w.targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def timed_steps(step, until) -> list[float]:
    """Durations of `step()` run until `until(steps done so far)` is true."""
    times = []
    while not until(len(times)):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def measure_slowdown(job: dict[str, Any], w, grad_bytes: int, group, reps: int = 6, steps: int = 10,
                     stream_s: float = 0.6) -> dict[str, Any]:
    """How much slower this model's training step runs while all-reduces stream, at the links' current rate.

    Per repetition: `steps` steps alone, then steps while a second thread runs a fixed number of
    all-reduces of the model's gradient size back to back (about `stream_s` seconds; every rank
    runs the same number, so none is left waiting), the engine's setting: one compute thread,
    one gloo thread. Every rank measures at once; the factor is `slowdown_factor` of the ratios.
    """
    import math
    import threading

    step = train_step(w, sgd(w.model, job["lr"]))
    buf = torch.ones(max(1, grad_bytes // 4))
    step()
    t = time.perf_counter()
    group.allreduce([buf]).wait()
    one = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    count = min(50, max(2, math.ceil(stream_s / max(float(one), 1e-6))))
    ratios = []
    for _ in range(reps):
        dist.barrier()
        alone = timed_steps(step, lambda n: n >= steps)
        dist.barrier()

        def stream() -> None:
            for _ in range(count):
                group.allreduce([buf]).wait()

        th = threading.Thread(target=stream)
        th.start()
        beside = timed_steps(step, lambda n: n >= 1 and not th.is_alive())
        th.join()
        ratios.append(statistics.median(beside) / statistics.median(alone))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, ratios)
    return {"compute_slowdown": slowdown_factor(every), "per_rank": [statistics.median(rs) for rs in every],
            "ratios": [r for rs in every for r in rs], "allreduces": count}


def slowdown_factor(ratios_by_rank: list[list[float]]) -> float:
    """The compute slowdown the simulator takes from per-rank, per-repetition step-time ratios
    (beside streaming all-reduces / alone; every rank's repetition i ran at the same time).

    The network's kernel work does not land evenly: in one repetition a rank's compute can slow
    3x while its peer's barely does, and in the next the other way round (ResNet-18 at
    500 Mbit/s). Every collective waits for the slowest rank, so each repetition counts its
    slowest rank; single repetitions range 1.0-5.5x there, so the factor is the median over
    repetitions (not a mean, which one outlier moves; not each rank's own median, whose maximum
    over ranks two repetitions left at the mercy of one of them). At least 1.
    """
    assert ratios_by_rank and all(len(rs) == len(ratios_by_rank[0]) for rs in ratios_by_rank), ratios_by_rank
    per_rep = [max(rs[i] for rs in ratios_by_rank) for i in range(len(ratios_by_rank[0]))]
    return max(1.0, statistics.median(per_rep))


def mute(planner: str, model, optimizer) -> None:
    """Replace the gradient collectives of a wrapped model with no-ops (everything else still
    runs): torch's `noop_hook` for DDP (`planner` "ddp"), `mute_gradient_communication` for the
    engine (the optimizer `caramel.parallelize` returned)."""
    if planner == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        model.register_comm_hook(None, noop_hook)
    else:
        from caramel.strategies.caramel.parallelize import mute_gradient_communication

        mute_gradient_communication(optimizer)


def measure_compute(job: dict[str, Any], configs: list[tuple[int, dict[str, Any]]], plans: list, device: torch.device,
                    timeout_s: float, rounds: int = 4, steps: int = 4) -> dict[str, Any]:
    """Each configuration's step with its gradient communication muted (`mute`), and the plain step.

    Every configuration is built as it is timed later, muted, warmed up, then timed in `rounds`
    interleaved rounds of `steps` steps (`measure_block`, the harness's timing), in a rotating
    order, every rank at once. Returns each rank's median per configuration (`muted_s`, keyed by
    the configuration's index) and the plain step's (`plain_s`).
    """
    from caramel.bench.baselines import ComputeOnly
    from caramel.bench.harness import measure_block, round_order

    w = workload(job, device)
    runners: dict[Any, Any] = {"plain": ComputeOnly(w.model, sgd(w.model, job["lr"]), w.inputs, w.targets, w.loss_fn, device)}
    for i, cfg in configs:
        runners[i] = build_runner(cfg, plans[i], job, device, timeout_s)
        mute(cfg["planner"], runners[i].model, runners[i].optimizer)
    keys = list(runners)
    for k in keys:
        for _ in range(2):
            runners[k].step()
        runners[k].finish()
    times: dict[Any, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in round_order(keys, r):
            dist.barrier()
            times[k].extend(measure_block(runners[k], steps))
    for i, cfg in configs:
        if cfg["planner"] != "ddp":
            runners[i].optimizer.engine.release()
    dist.barrier()
    mine = {str(k): statistics.median(v) for k, v in times.items()}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {"plain_s": [e["plain"] for e in every],
            "muted_s": {str(i): [e[str(i)] for e in every] for i, _ in configs}}


def muted_step_s(measured: dict[str, Any], index: int) -> float:
    """The compute step a configuration runs at: its slowest rank's muted median (every
    collective waits for that rank)."""
    return max(measured["muted_s"][str(index)])


def plain_step_s(measured: dict[str, Any]) -> float:
    """The plain step at that bandwidth's turn: its slowest rank's median."""
    return max(measured["plain_s"])
