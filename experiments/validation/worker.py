"""The per-rank worker of a simulator validation job (`experiments.validation.run` starts it).

One job covers one model on one cluster (fixed number of workers) and every bandwidth and
strategy of that model. On every rank, in this order:

1. profile the model with `caramel.profile_model`, all ranks at once, so compute runs under the
   same contention for the host's cores as in the timed steps (the slowest rank's profile is
   used: the job runs at that rank's pace);
2. rank 0 plans every configuration for the calibrated `ClusterSpec` (the link rate of the
   configuration times the goodput factor, and the latency, both fitted once before any job);
   the plans go to every rank, so the engine runs exactly the plan that is simulated;
3. for each bandwidth, rank 0 asks the host runner to reshape the links (a request file; the
   host answers with a done file), then every rank calibrates what a profile cannot give
   (`experiments.validation.calibrate`): the compute slowdown beside streaming all-reduces, and
   each configuration's step with its gradient communication muted;
4. rank 0 simulates every configuration and writes the predictions to disk *before any timed
   step runs*;
5. for each bandwidth again, every strategy of that bandwidth is built, warmed up and timed in
   interleaved rounds, as the bench harness times them (`measure_block`: one untimed entry
   step, then steps timed top of loop to top of loop, then a drain).

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
from experiments.validation.calibrate import (build_runner, measure_compute, measure_slowdown, muted_step_s, plain_step_s, sgd,
                                            timed_steps, train_step, workload)

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


def profile_for(config: dict[str, Any], profile):
    """The profile a configuration runs: torch DDP reduces a tied weight's gradient whole."""
    return profile.unsplit() if config["planner"] == "ddp" else profile


def sim_plan_for(config: dict[str, Any], profile, cluster):
    """The plan and overlap the simulator replays for one configuration (`ddp` is fifo/backward)."""
    from caramel.strategies.planners import make_plan

    options = dict(config["options"])
    if config["planner"] == "ddp":
        # torch DDP: buckets in ready order, a 1 MiB first bucket, then bucket_cap_mb; all
        # collectives awaited at the end of backward; a tied weight's gradient whole.
        return make_plan("fifo", profile_for(config, profile), cluster, **options), "backward"
    if config["planner"] == "caramel":
        options.setdefault("overlap", config["overlap"])
    return make_plan(config["planner"], profile, cluster, **options), config["overlap"]


def make_plans(job: dict[str, Any], profile) -> list[dict[str, Any]]:
    """Plan every configuration of the job for its calibrated cluster (rank 0, before anything is timed)."""
    out = []
    for cfg in job["configs"]:
        t0 = time.perf_counter()
        plan, overlap = sim_plan_for(cfg, profile, _cluster(job, cfg))
        out.append({"plan": plan, "overlap": overlap, "plan_s": time.perf_counter() - t0})
    return out


def _cluster(job: dict[str, Any], cfg: dict[str, Any], speed: float = 1.0):
    from caramel.topology.spec import ClusterSpec, WorkerSpec

    cal = job["calibration"]
    return ClusterSpec([WorkerSpec(f"w{r}", speed) for r in range(job["workers"])], cfg["bandwidth_bps"] * cal["goodput"],
                       cal["latency_s"], meta={"nominal_bandwidth_bps": cfg["bandwidth_bps"]},
                       queued_latency_s=cal.get("queued_latency_s"))


def predict(job: dict[str, Any], job_profile, plans: list[dict[str, Any]], muted_s: list[float | None] | None = None,
            plain_s: list[float | None] | None = None) -> list[dict[str, Any]]:
    """Simulate every configuration's plan (rank 0, before anything is timed).

    The compute replayed is the profile's shape, scaled so that one step takes the plain step
    timed at the configuration's bandwidth (`plain_s[i]`, `validate_calibrate.measure_compute`;
    None keeps the profile's length): the profile is taken once per job, and the host's compute
    speed moves between then and each bandwidth's turn. Each plan is also simulated with the
    profile's own length, and at the configuration's muted step (`muted_s[i]`): what each input
    changes is scored on the same measurements (docs/simulator.md, runs u-z).
    """
    from caramel.sim.interference import Interference, corrected_step_time_s
    from caramel.sim.simulate import simulate

    cal = job["calibration"]
    # compute beside a collective runs inside the event engine at the slowdown measured at this
    # configuration's rate; a collective beside compute gets the first-order term
    comm_only = Interference(1.0, cal.get("comm_slowdown", 1.0))
    by_bps = cal.get("slowdown_by_bps", {})
    none = [None] * len(plans)
    out = []
    for cfg, planned, muted, plain in zip(job["configs"], plans, muted_s or none, plain_s or none):
        plan, overlap = planned["plan"], planned["overlap"]
        profile = profile_for(cfg, job_profile)
        slowdown = float(by_bps.get(str(int(cfg["bandwidth_bps"])), cal.get("compute_slowdown", 1.0)))

        def corrected(spec) -> tuple[float, float]:
            return corrected_step_time_s(simulate(profile, spec, plan, overlap=overlap, trace=True, compute_slowdown=slowdown),
                                         comm_only)

        def speed_for(step_s: float | None) -> float:
            return profile.step_time_s / step_s if step_s else 1.0

        speed = speed_for(plain)
        cluster = _cluster(job, cfg, speed)
        result = simulate(profile, cluster, plan, overlap=overlap, trace=True)
        step, overlap_s = corrected(cluster)
        # the same plan as if every collective paid the lone latency (before the queued model),
        # at the profile's own length, and at the muted step's: what each changes is scored on
        # the same measurements
        lone_s, _ = corrected(dataclasses.replace(cluster, queued_latency_s=None))
        as_profiled = corrected(_cluster(job, cfg))[0] if speed != 1.0 else step
        muted_speed = speed_for(muted)
        muted_pred = corrected(_cluster(job, cfg, muted_speed))[0] if muted_speed != speed else step
        out.append({"plan": plan, "predicted_step_time_s": result.step_time_s, "compute_slowdown": slowdown,
                    "predicted_interference_step_time_s": step, "predicted_overlap_s": overlap_s,
                    "predicted_lone_latency_step_time_s": lone_s, "predicted_profile_compute_step_time_s": as_profiled,
                    "predicted_muted_compute_step_time_s": muted_pred, "profile_step_s": profile.step_time_s,
                    "plain_step_s": plain, "compute_speed": speed, "muted_step_s": muted, "muted_compute_speed": muted_speed,
                    "predicted_bound": result.critical_path["bound"],
                    "predicted_compute_s": result.compute_time_s, "predicted_comm_s": result.comm_time_s,
                    "predicted_exposed_s": result.exposed_comm_s, "items": plan.num_items(),
                    "plan_fingerprint": plan.fingerprint, "plan_s": planned["plan_s"]})
    return out


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


def measure_bandwidth(job: dict[str, Any], index: int, bandwidth_bps: float, configs: list[tuple[int, dict]],
                      plans: list, device: torch.device, rank: int, timeout_s: float,
                      compute_baseline: bool = False) -> dict[str, Any]:
    """Time every configuration at one bandwidth in interleaved rounds; per-rank step times."""
    from caramel.bench.baselines import ComputeOnly
    from caramel.bench.harness import measure_block, round_order

    _wait_for_bandwidth(job, index, bandwidth_bps, rank)
    runners = {}
    for i, cfg in configs:
        runners[i] = build_runner(cfg, plans[i], job, device, timeout_s)
    if compute_baseline and job["compute_baseline"]:
        w = workload(job, device)
        runners["compute"] = ComputeOnly(w.model, sgd(w.model, job["lr"]), w.inputs, w.targets, w.loss_fn, device)
    keys = list(runners)
    for k in keys:
        for _ in range(job["warmup_steps"]):
            runners[k].step()
        runners[k].finish()
        dist.barrier()
    times: dict[Any, list[list[float]]] = {k: [] for k in keys}
    for r in range(job["rounds"]):
        for k in round_order(keys, r):
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

    w = workload(job, device)
    model = copy.deepcopy(w.model)
    dist.barrier()
    t0 = time.time()
    profile = caramel.profile_model(model, w.inputs, w.targets, w.loss_fn, optimizer=sgd(model, job["lr"]),
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
    plans = make_plans(job, profile) if rank == 0 else None
    box = [plans]
    dist.broadcast_object_list(box, src=0)
    plans = box[0]
    # Calibration, not fitting, at each rate, before any configuration is timed (the host
    # reshapes the links): how much this model's compute slows while collectives stream, and
    # each configuration's step with its gradient communication muted.
    from caramel.distributed import gloo_group
    from caramel.runtime.comm_priority import CommPriority

    # at the priority the engine gives its own threads (comm_priority="auto"), so that the
    # slowdown is measured as the engine's collectives cause it
    group = gloo_group("slowdown", None, threads=1, timeout_s=timeout_s, priority=CommPriority.resolve("auto"))
    grad_bytes = sum(p.bytes for p in profile.params if p.requires_grad)
    configs_at = {bw: [(i, c) for i, c in enumerate(job["configs"]) if c["bandwidth_bps"] == bw] for bw in bandwidths}
    slowdowns, muted = {}, {}
    for index, bw in enumerate(bandwidths):
        _wait_for_bandwidth(job, index, bw, rank)
        key = str(int(bw))
        slowdowns[key] = measure_slowdown(job, workload(job, device), grad_bytes, group)
        muted[key] = measure_compute(job, configs_at[bw], [p["plan"] for p in plans], device, timeout_s)
        _log(rank, f"{bw / 1e6:g} Mbit/s: compute runs {slowdowns[key]['compute_slowdown']:.2f}x slower beside "
                   "all-reduces; muted steps " + ", ".join(f"{1e3 * muted_step_s(muted[key], i):.1f}" for i, _ in configs_at[bw])
                   + f" ms against {1e3 * plain_step_s(muted[key]):.1f} plain")
    job = dict(job, calibration=dict(job["calibration"], slowdown_by_bps={k: v["compute_slowdown"] for k, v in slowdowns.items()}))
    at_bw = [muted[str(int(c["bandwidth_bps"]))] for c in job["configs"]]
    predictions = predict(job, profile, plans, muted_s=[muted_step_s(m, i) for i, m in enumerate(at_bw)],
                          plain_s=[plain_step_s(m) for m in at_bw]) if rank == 0 else None
    if rank == 0:
        # On disk before the first timed step: these numbers cannot be adjusted afterwards.
        write_json(Path(job["ctl_dir"]) / "predictions.json", {
            "format": format_tag("validation_predictions"), "written_at": time.time(), "profile": profile.to_dict(),
            "predictions": [{k: v for k, v in p.items() if k != "plan"} for p in predictions]})
    plans = [p["plan"] for p in plans]
    _log(rank, f"predicted {len(plans)} configurations; measuring")

    measured = []
    measure_started_at = time.time()
    for index, bw in enumerate(bandwidths):
        measured.append({"bandwidth_bps": bw, "configs": [i for i, _ in configs_at[bw]],
                         **measure_bandwidth(job, len(bandwidths) + index, bw, configs_at[bw], plans, device, rank, timeout_s,
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
        "muted": muted,
        "measured": [[g[j] for g in gathered] for j in range(len(bandwidths))],
        "meta": {"world_size": world, "backend": dist.get_backend(), "torch": torch.__version__,
                 "threads_per_worker": torch.get_num_threads(), "load_average": os.getloadavg()},
    }


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
    w = workload(job, torch.device(info.device))
    step = train_step(w, sgd(w.model, job["lr"]))
    from caramel.runtime.comm_priority import CommPriority

    # at the engine's priority, as the slowdown group above
    group = gloo_group("interference", None, threads=1, timeout_s=float(job["timeout_s"]),
                       priority=CommPriority.resolve("auto"))
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
        alone = timed_steps(step, lambda n: n >= 12)
        dist.barrier()
        comm_with: list[float] = []
        th = threading.Thread(target=reduce_all, args=(comm_with,))
        th.start()
        with_comm = timed_steps(step, lambda n: not th.is_alive())
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
        print("usage: python -m experiments.validation.worker JOB.json OUT.json", file=sys.stderr)
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
