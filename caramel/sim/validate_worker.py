"""The per-rank worker of a simulator validation job (`caramel.sim.validate_run` starts it).

One job covers one model on one cluster (fixed number of workers) and every bandwidth and
strategy of that model. On every rank, in this order:

1. profile the model with `caramel.profile_model`, all ranks at once, so compute runs under the
   same contention for the host's cores as in the timed steps (the slowest rank's profile is
   used: the job runs at that rank's pace);
2. rank 0 plans every configuration and simulates it on the calibrated `ClusterSpec` (the link
   rate of the configuration times the goodput factor, and the latency, both fitted once before
   any job), and writes the predictions to disk *before any timed step runs*; the plans go to
   every rank, so the engine runs exactly the plan that was simulated;
3. for each bandwidth, rank 0 asks the host runner to reshape the links (a request file; the
   host answers with a done file), then every strategy of that bandwidth is built, warmed up and
   timed in interleaved rounds, as the bench harness times them (`measure_block`: one untimed
   entry step, then steps timed top of loop to top of loop, then a drain).

Rank 0 writes `caramel.validation_raw/1` with the predictions, the per-rank step times and the
engine's own statistics (its plan fingerprint is checked against the simulated plan's).
"""
from __future__ import annotations

import copy
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.jsonio import atomic_write_text, check_format, format_tag, read_json, write_json

JOB_KIND = "validation_job"
RAW_KIND = "validation_raw"
INTERFERENCE_KIND = "validation_interference"
BANDWIDTH_WAIT_S = 60.0


def request_path(ctl_dir: str | os.PathLike, index: int) -> Path:
    """File in which rank 0 asks the host for the bandwidth of step `index` (its text: bits/s)."""
    return Path(ctl_dir) / f"bandwidth-{index}.request"


def done_path(ctl_dir: str | os.PathLike, index: int) -> Path:
    """File the host writes once every link runs at the requested rate."""
    return Path(ctl_dir) / f"bandwidth-{index}.done"


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[validate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _workload(job: dict[str, Any], device: torch.device):
    from caramel.models.zoo import get_model

    w = get_model(job["model"])(seed=job["seed"], batch_size=job["batch_size"], **job["model_options"])
    w.model.to(device)
    w.inputs, w.targets = w.inputs.to(device), w.targets.to(device)
    return w


def _sgd(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def sim_plan_for(config: dict[str, Any], profile, cluster):
    """The plan and overlap the simulator replays for one configuration (`ddp` is fifo/backward)."""
    from caramel.plan.planners import make_plan

    options = dict(config["options"])
    if config["planner"] == "ddp":
        # torch DDP: buckets in ready order, a 1 MiB first bucket, then bucket_cap_mb; all
        # collectives awaited at the end of backward.
        return make_plan("fifo", profile, cluster, **options), "backward"
    if config["planner"] == "caramel":
        options.setdefault("overlap", config["overlap"])
    return make_plan(config["planner"], profile, cluster, **options), config["overlap"]


def predict(job: dict[str, Any], profile) -> list[dict[str, Any]]:
    """Plan and simulate every configuration of the job (rank 0, before anything is timed)."""
    from caramel.cluster.spec import ClusterSpec
    from caramel.sim.simulate import simulate

    from caramel.sim.interference import Interference, corrected_step_time_s

    cal = job["calibration"]
    # compute beside a collective runs inside the event engine at the slowdown measured at this
    # configuration's rate; a collective beside compute gets the first-order term
    comm_only = Interference(1.0, cal.get("comm_slowdown", 1.0))
    by_bps = cal.get("slowdown_by_bps", {})
    out = []
    for cfg in job["configs"]:
        cluster = ClusterSpec.uniform(job["workers"], cfg["bandwidth_bps"] * cal["goodput"], cal["latency_s"],
                                      meta={"nominal_bandwidth_bps": cfg["bandwidth_bps"]},
                                      queued_latency_s=cal.get("queued_latency_s"))
        t0 = time.perf_counter()
        plan, overlap = sim_plan_for(cfg, profile, cluster)
        result = simulate(profile, cluster, plan, overlap=overlap, trace=True)
        slowdown = float(by_bps.get(str(int(cfg["bandwidth_bps"])), cal.get("compute_slowdown", 1.0)))
        contended = simulate(profile, cluster, plan, overlap=overlap, trace=True, compute_slowdown=slowdown)
        corrected, overlap_s = corrected_step_time_s(contended, comm_only)
        # the same plan as if every collective paid the lone latency (before the queued model),
        # so that what the queued model changes is scored on the same measurements
        lone = dataclasses.replace(cluster, queued_latency_s=None)
        lone_s, _ = corrected_step_time_s(simulate(profile, lone, plan, overlap=overlap, trace=True, compute_slowdown=slowdown),
                                          comm_only)
        out.append({"plan": plan, "predicted_step_time_s": result.step_time_s, "compute_slowdown": slowdown,
                    "predicted_interference_step_time_s": corrected, "predicted_overlap_s": overlap_s,
                    "predicted_lone_latency_step_time_s": lone_s,
                    "predicted_bound": result.critical_path["bound"],
                    "predicted_compute_s": result.compute_time_s, "predicted_comm_s": result.comm_time_s,
                    "predicted_exposed_s": result.exposed_comm_s, "items": plan.num_items(),
                    "plan_fingerprint": plan.fingerprint, "plan_s": time.perf_counter() - t0})
    return out


def _build_runner(cfg: dict[str, Any], plan, job: dict[str, Any], device: torch.device, timeout_s: float):
    import caramel
    from caramel.bench.strategies import TrainRunner

    w = _workload(job, device)
    opt = _sgd(w.model, job["lr"])
    name = cfg["name"]
    if cfg["planner"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(w.model, **cfg["options"])
        return TrainRunner(name, wrapped, opt, w.inputs, w.targets, w.loss_fn, device)
    wrapped, opt = caramel.parallelize(w.model, opt, plan=plan, overlap=cfg["overlap"], timeout_s=timeout_s)
    return TrainRunner(name, wrapped, opt, w.inputs, w.targets, w.loss_fn, device, finish=opt.synchronize,
                       stats=opt.engine.stats_dict)


def _wait_for_bandwidth(job: dict[str, Any], index: int, bandwidth_bps: float, rank: int) -> None:
    """Rank 0 asks the host to reshape every link; all ranks continue together afterwards."""
    if rank == 0:
        atomic_write_text(request_path(job["ctl_dir"], index), f"{bandwidth_bps:g}\n")  # never seen half-written
        deadline = time.monotonic() + BANDWIDTH_WAIT_S
        while not done_path(job["ctl_dir"], index).exists():
            if time.monotonic() > deadline:
                raise CaramelError(f"the host did not reshape the links to {bandwidth_bps:g} bit/s within {BANDWIDTH_WAIT_S:g} s")
            time.sleep(0.05)
    dist.barrier()


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

    step = _train_step(w, _sgd(w.model, job["lr"]))
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
        alone = _timed_steps(step, lambda n: n >= steps)
        dist.barrier()

        def stream() -> None:
            for _ in range(count):
                group.allreduce([buf]).wait()

        th = threading.Thread(target=stream)
        th.start()
        beside = _timed_steps(step, lambda n: n >= 1 and not th.is_alive())
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


def measure_bandwidth(job: dict[str, Any], index: int, bandwidth_bps: float, configs: list[tuple[int, dict]],
                      plans: list, device: torch.device, rank: int, timeout_s: float,
                      compute_baseline: bool = False) -> dict[str, Any]:
    """Time every configuration at one bandwidth in interleaved rounds; per-rank step times."""
    from caramel.bench.baselines import ComputeOnly
    from caramel.bench.harness import measure_block

    _wait_for_bandwidth(job, index, bandwidth_bps, rank)
    runners = {}
    for i, cfg in configs:
        runners[i] = _build_runner(cfg, plans[i], job, device, timeout_s)
    if compute_baseline and job["compute_baseline"]:
        w = _workload(job, device)
        runners["compute"] = ComputeOnly(w.model, _sgd(w.model, job["lr"]), w.inputs, w.targets, w.loss_fn, device)
    keys = list(runners)
    for k in keys:
        for _ in range(job["warmup_steps"]):
            runners[k].step()
        runners[k].finish()
        dist.barrier()
    times: dict[Any, list[list[float]]] = {k: [] for k in keys}
    for r in range(job["rounds"]):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for k in order:
            dist.barrier()
            times[k].append(measure_block(runners[k], job["steps_per_round"]))
        _log(rank, f"{bandwidth_bps / 1e6:g} Mbit/s: round {r + 1}/{job['rounds']} done")
    stats = {k: runners[k].stats() for k in keys}
    for k in keys:
        runners[k].finish()
    dist.barrier()
    return {"times": {str(k): v for k, v in times.items()}, "stats": {str(k): _plain(v) for k, v in stats.items()}}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return value.item() if hasattr(value, "item") else str(value)


def run_job(job: dict[str, Any]) -> dict[str, Any] | None:
    """Profile, predict (rank 0, written before timing), then measure; rank 0 returns everything."""
    import caramel

    check_format(job, JOB_KIND, "validation job")
    torch.set_num_threads(1)
    timeout_s = float(job["timeout_s"])
    info = caramel.init_distributed(timeout_s=timeout_s)
    rank, world, device = info.rank, info.world_size, torch.device(info.device)
    if world != job["workers"]:
        raise CaramelError(f"validation job for {job['workers']} workers started with {world}")

    w = _workload(job, device)
    model = copy.deepcopy(w.model)
    dist.barrier()
    t0 = time.time()
    profile = caramel.profile_model(model, w.inputs, w.targets, w.loss_fn, optimizer=_sgd(model, job["lr"]),
                                    steps=job["profile_steps"], name=job["model"])
    # The job runs at its slowest rank's pace, and the ranks' speeds differ on a shared host
    # (where the network's kernel work lands): predict with the slowest rank's profile.
    compute_s_by_rank: list[Any] = [None] * world
    dist.all_gather_object(compute_s_by_rank, profile.step_time_s)  # forward + backward + optimizer
    slowest = max(range(world), key=compute_s_by_rank.__getitem__)
    box = [profile if rank == slowest else None]
    dist.broadcast_object_list(box, src=slowest)
    profile = box[0]
    _log(rank, f"profiled {job['model']} (rank {slowest}, the slowest; compute per rank "
               + ", ".join(f"{1e3 * c:.1f}" for c in compute_s_by_rank) + f" ms): forward {profile.forward_time_s * 1e3:.1f} ms, "
               f"backward {profile.backward_time_s * 1e3:.1f} ms, optimizer {profile.optimizer_time_s * 1e3:.1f} ms")
    bandwidths = sorted({c["bandwidth_bps"] for c in job["configs"]}, key=lambda b: [c["bandwidth_bps"] for c in job["configs"]].index(b))
    # Calibration, not fitting: how much this model's compute slows while collectives stream,
    # at each rate, measured before any configuration is timed (the host reshapes the links).
    from caramel.distributed import gloo_group

    group = gloo_group("slowdown", None, threads=1, timeout_s=timeout_s)
    grad_bytes = sum(p.bytes for p in profile.params if p.requires_grad)
    slowdowns = {}
    for index, bw in enumerate(bandwidths):
        _wait_for_bandwidth(job, index, bw, rank)
        slowdowns[str(int(bw))] = measure_slowdown(job, _workload(job, device), grad_bytes, group)
        _log(rank, f"{bw / 1e6:g} Mbit/s: compute runs {slowdowns[str(int(bw))]['compute_slowdown']:.2f}x slower beside all-reduces")
    job = dict(job, calibration=dict(job["calibration"], slowdown_by_bps={k: v["compute_slowdown"] for k, v in slowdowns.items()}))
    predictions = predict(job, profile) if rank == 0 else None
    if rank == 0:
        # On disk before the first timed step: these numbers cannot be adjusted afterwards.
        write_json(Path(job["ctl_dir"]) / "predictions.json", {
            "format": format_tag("validation_predictions"), "written_at": time.time(), "profile": profile.to_dict(),
            "predictions": [{k: v for k, v in p.items() if k != "plan"} for p in predictions]})
    box = [[p["plan"] for p in predictions] if predictions else None]
    dist.broadcast_object_list(box, src=0)
    plans = box[0]
    _log(rank, f"predicted {len(plans)} configurations; measuring")

    measured = []
    measure_started_at = time.time()
    for index, bw in enumerate(bandwidths):
        configs = [(i, c) for i, c in enumerate(job["configs"]) if c["bandwidth_bps"] == bw]
        measured.append({"bandwidth_bps": bw, "configs": [i for i, _ in configs],
                         **measure_bandwidth(job, len(bandwidths) + index, bw, configs, plans, device, rank, timeout_s,
                                             compute_baseline=index == 0)})
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, measured)
    if rank != 0:
        return None
    return {
        "format": format_tag(RAW_KIND),
        "job": {k: v for k, v in job.items() if k != "configs"},
        "configs": job["configs"],
        "profile_started_at": t0,
        "measure_started_at": measure_started_at,
        "predictions": [{k: v for k, v in p.items() if k != "plan"} for p in predictions],
        "slowdowns": slowdowns,
        "measured": [[g[j] for g in gathered] for j in range(len(bandwidths))],
        "meta": {"world_size": world, "backend": dist.get_backend(), "torch": torch.__version__,
                 "threads_per_worker": torch.get_num_threads(), "load_average": os.getloadavg()},
    }


def _train_step(w, opt):
    """One plain training step of workload `w` (the compute the interference measurements time)."""
    def step() -> None:
        w.loss_fn(w.model(w.inputs), w.targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _timed_steps(step, until) -> list[float]:
    """Durations of `step()` run until `until(steps done so far)` is true."""
    times = []
    while not until(len(times)):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def measure_interference(job: dict[str, Any]) -> dict[str, Any] | None:
    """Slowdown of a reference step while all-reduces stream, and of the all-reduces while it runs.

    Per repetition, on every rank: `collectives` all-reduces of `bytes` alone (timed), then the
    reference step repeated alone for as many steps, then both at once: a thread runs the same
    all-reduces (timed) while the main thread steps until it is done. The engine's setting:
    one compute thread and one Gloo thread per worker. Rank 0 returns the ratios.
    """
    import threading

    import caramel
    from caramel.distributed import gloo_group

    check_format(job, INTERFERENCE_KIND, "interference job")
    torch.set_num_threads(1)
    info = caramel.init_distributed(timeout_s=float(job["timeout_s"]))
    w = _workload(job, torch.device(info.device))
    step = _train_step(w, _sgd(w.model, job["lr"]))
    group = gloo_group("interference", None, threads=1, timeout_s=float(job["timeout_s"]))
    buf = torch.ones(job["bytes"] // 4)

    def reduce_all(out: list[float]) -> None:
        t = time.perf_counter()
        for _ in range(job["collectives"]):
            group.allreduce([buf]).wait()
        out.append(time.perf_counter() - t)

    for _ in range(3):
        step()
    reps = []
    for _ in range(job["reps"]):
        dist.barrier()
        comm_alone: list[float] = []
        reduce_all(comm_alone)
        dist.barrier()
        alone = _timed_steps(step, lambda n: n >= 12)
        dist.barrier()
        comm_with: list[float] = []
        th = threading.Thread(target=reduce_all, args=(comm_with,))
        th.start()
        with_comm = _timed_steps(step, lambda n: not th.is_alive())
        th.join()
        reps.append({"step_alone_s": statistics.median(alone), "step_with_comm_s": statistics.median(with_comm) if with_comm else None,
                     "comm_alone_s": comm_alone[0], "comm_with_compute_s": comm_with[0]})
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, reps)
    if info.rank != 0:
        return None
    pairs = [r for rank in gathered for r in rank if r["step_with_comm_s"]]
    return {"format": format_tag(INTERFERENCE_KIND + "_result"), "reps": gathered,
            "compute_slowdown": max(1.0, statistics.median(r["step_with_comm_s"] / r["step_alone_s"] for r in pairs)),
            "comm_slowdown": max(1.0, statistics.median(r["comm_with_compute_s"] / r["comm_alone_s"] for r in pairs)),
            "load_average": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m caramel.sim.validate_worker JOB.json OUT.json", file=sys.stderr)
        return 2
    import json

    is_interference = json.loads(Path(argv[0]).read_text()).get("format") == format_tag(INTERFERENCE_KIND)
    job = read_json(argv[0], INTERFERENCE_KIND if is_interference else JOB_KIND)
    raw = measure_interference(job) if is_interference else run_job(job)
    if raw is not None:
        write_json(argv[1], raw)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
