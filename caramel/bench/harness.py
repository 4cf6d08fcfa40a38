"""The per-rank bench worker: every strategy and both baselines, interleaved, in one process group.

Run by the launcher on each worker (`python -m caramel.bench.harness JOB.json OUT.json` under
torchrun or the emulated cluster). Rank 0 writes the raw per-step times of every rank to
OUT.json (`caramel.bench_raw/1`); `caramel.bench.report` turns them into metrics.

How a step is timed: no barrier inside a measured block. A block is its runner's unmeasured
entry steps (so a strategy that overlaps communication with the *next* forward is in its steady
state; one, or S + 1 under ps `ssp:S`: `caramel.bench.blocks`), then `steps` steps, each
timed from the top of the loop to the top of the next iteration: exactly the time a user's
loop spends per iteration, including any wait in the next forward for the previous step's
communication. After the block, `finish()` drains what is still
pending (unmeasured) and a barrier lines the ranks up for the next strategy. Rounds rotate the
order of strategies so that drift and position effects hit all of them equally.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from caramel.bench.baselines import ComputeOnly, Runner, ddp_bucket_bytes, trainable_params
from caramel.bench.blocks import measure_block, round_order
from caramel.bench.job_profile import sharing_note
from caramel.bench.lower_bound import effective_bandwidth_bps, lower_bound_s
from caramel.bench.matrix import BenchConfig, BenchSettings, Strategy
from caramel.bench.node_probe import probe_node_rate
from caramel.bench.hetero_prediction import Heterogeneity, job_heterogeneity
from caramel.bench.prediction import job_predictions, probe_link
from caramel.bench.report import job_step_times
from caramel.bench.runners import bench_sgd, build_runners, jitter_of, log_rank0, make_workload, slow_worker_of
from caramel.bench.screening import as_screened, predictions_by_name
from caramel.bench.strategies import StrategyContext
from caramel.bench.trace_control import TraceClock
from caramel.bench.traffic_probe import probe_traffic
from caramel.errors import CaramelError
from caramel.jsonio import check_format, format_tag, read_json, write_json
from caramel.models.zoo import param_count
from caramel.stats import median

# re-exported: the runners' setup lived here, and callers import these names from this module
__all__ = ["JOB_KIND", "PREDICTION_INPUTS", "RAW_KIND", "build_runners", "make_calibration_job", "make_job",
           "make_workload", "measure_block", "measure_rounds", "round_order", "run_calibration", "run_job", "settle"]

if TYPE_CHECKING:
    from caramel.bench.wire import WireMeter

JOB_KIND = "bench_job"
RAW_KIND = "bench_raw"


PREDICTION_INPUTS = "prediction_inputs.json"  # under the job's trace directory (`--trace`)


def make_job(config: BenchConfig, settings: BenchSettings, strategies: list[Strategy],
             network: str, trace_dir: str | None = None) -> dict[str, Any]:
    """The job file every rank reads: what to run and how."""
    return {
        "format": format_tag(JOB_KIND),
        "config": config.to_dict(),
        "settings": vars(settings).copy(),
        "strategies": [s.to_dict() for s in strategies],
        "network": network,
        "trace_dir": trace_dir,
    }


def make_calibration_job(config: BenchConfig, settings: BenchSettings, network: str) -> dict[str, Any]:
    """A job that measures only the compute-only baseline (caramel.bench.rates derives rates from it)."""
    return dict(make_job(config, settings, [], network), mode="calibrate")


def _init_process_group(timeout_s: float) -> tuple[int, int, torch.device]:
    """Join the launcher's process group (torchrun's environment) as every Caramel program does."""
    from caramel.distributed import init_distributed

    info = init_distributed(timeout_s=timeout_s)
    device = torch.device(info.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return info.rank, info.world_size, device


# online profiling (4 steps) + an overlap trial of up to 3 passes of 30 steps and a confirmation
# of 20 (114 with the default trial_steps=5), with room to spare
MAX_SETTLE_STEPS = 150


def settle(runner: Runner, name: str, max_steps: int = MAX_SETTLE_STEPS) -> int:
    """Step `runner` until it has settled on its schedule (caramel: online profiling and the
    overlap trial), so that the measured rounds time the schedule a long run would use; returns
    the steps taken.

    Each rank asks its own runner (the engine settles at the same step on every rank) and one
    collective afterwards checks that they agree: a collective per step would queue behind the
    strategy's own transfers on the shaped link and slow the very steps the trial times."""
    steps = 0
    while steps < max_steps and not runner.settled():
        runner.step()
        steps += 1
    runner.finish()
    seen = torch.tensor([steps, -steps], dtype=torch.int64)
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    if int(seen[0]) != steps or int(-seen[1]) != steps:
        raise CaramelError(f"strategy {name!r} settled after {steps} steps on rank {dist.get_rank()}, another rank "
                           f"after {int(-seen[1])} to {int(seen[0])}: ranks must run the same steps")
    return steps


def measure_rounds(runners: dict[str, Runner], settings: BenchSettings, label: str, rank: int,
                   trace: TraceClock | None = None, wire: WireMeter | None = None) -> dict[str, list[float]]:
    """Warm every runner up and let it settle, then `rounds` rounds of one block each, the order
    rotating per round (`wire`: counts each block's transmitted bytes; with a bandwidth `trace`:
    rounds until its last phase ends)."""
    names = list(runners)
    for name in names:
        for _ in range(settings.warmup_steps):
            runners[name].step()
        settle(runners[name], name)
        runners[name].start_measuring()
        dist.barrier()
    times: dict[str, list[float]] = {n: [] for n in names}
    if trace is not None:
        trace.start()
    r = 0
    while trace.more(r) if trace is not None else r < settings.rounds:
        for name in round_order(names, r):
            dist.barrier()
            stamps = trace.stamps_for(name) if trace is not None else None
            if wire is None:
                times[name] += measure_block(runners[name], settings.steps_per_round, stamps)
            else:
                with wire.count(name, settings.steps_per_round + runners[name].entry_steps):  # + the entry steps
                    times[name] += measure_block(runners[name], settings.steps_per_round, stamps)
        r += 1
        # rank 0's own view; the compute-only baseline at its pace and a timed drain's block mean,
        # as the report takes them
        log_rank0(rank, f"{label}: round {r}/{'trace' if trace is not None else settings.rounds} medians "
                   "(compute, timed drains: mean) "
                   + ", ".join(f"{n}={1e3 * (sum(t) / len(t) if n == 'compute' or runners[n].drain_timed else median(t)):.1f}ms"
                               for n, t in times.items()))
    dist.barrier()
    return times


def run_calibration(config: BenchConfig, settings: BenchSettings, rank: int, world: int,
                    device: torch.device) -> dict[str, Any] | None:
    """The compute-only baseline alone, warmed up, in rounds as the bench measures it; rank 0
    returns every rank's step times, the gradient bytes and the comm-only baseline's buckets."""
    w = make_workload(config, settings.seed, device)
    runner = ComputeOnly(w.model, bench_sgd(w.model, settings), w.inputs, w.targets, w.loss_fn, device)
    for _ in range(settings.warmup_steps):
        runner.step()
    times: list[float] = []
    for _ in range(settings.rounds):
        dist.barrier()
        times += measure_block(runner, settings.steps_per_round)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, times)
    if rank != 0:
        return None
    params = trainable_params(w.model)
    sizes = [p.numel() * p.element_size() for p in params]
    log_rank0(rank, f"calibration: compute {1e3 * median(times):.1f} ms per step (rank 0)")
    return {"format": format_tag(RAW_KIND), "mode": "calibrate", "config": config.to_dict(),
            "settings": vars(settings).copy(), "step_times_s": {"compute": gathered}, "grad_bytes": sum(sizes),
            "comm_buckets": len(ddp_bucket_bytes(sizes)), "meta": {"world_size": world}}


def run_job(job: dict[str, Any]) -> dict[str, Any] | None:
    """Run one configuration on this rank; rank 0 returns the raw results of all ranks."""
    check_format(job, JOB_KIND, "bench job")
    config = BenchConfig.from_dict(job["config"])
    settings = BenchSettings(**job["settings"])
    strategies = [Strategy.from_dict(s) for s in job["strategies"]]
    torch.set_num_threads(1)  # one thread per worker: on a small host the workers share the cores
    rank, world, device = _init_process_group(settings.timeout_s)
    log_rank0(rank, f"process group up: {world} workers, {dist.get_backend()} on {device}")
    if job.get("mode") == "calibrate":
        return run_calibration(config, settings, rank, world, device)
    local = config.nproc_per_node
    if local > 1 and os.environ.get("LOCAL_WORLD_SIZE") != str(local):
        raise CaramelError(f"bench job for {local} ranks per host, but the launcher set LOCAL_WORLD_SIZE="
                           f"{os.environ.get('LOCAL_WORLD_SIZE')!r}")
    if world != config.workers:  # e.g. hosts x K x K ranks from a launcher given the ranks as hosts
        raise CaramelError(f"bench job for {config.workers} ranks ({config.hosts} hosts of {local}), but the "
                           f"launcher started {world}")
    ctx = StrategyContext(device=device, rank=rank, world_size=world, trace_dir=job.get("trace_dir"),
                          steps_per_block=settings.steps_per_round)
    if ctx.trace_dir:
        Path(ctx.trace_dir).mkdir(parents=True, exist_ok=True)

    slow = slow_worker_of(config, settings, rank, world, device)
    jitter = jitter_of(config, settings, world, device)
    profile = together = probed = None
    plan_inputs = None
    if any(s.kind == "pipeline" for s in strategies) and world > 1:
        # the pipelines plan from the profile and cluster the predictions use (`caramel.bench.pipeline_plan`)
        profile, together, grad_bytes = _job_profile(config, settings, device, strategies)
        probed = probe_link(grad_bytes, device, dist.get_backend(), world)
        plan_inputs = (profile, grad_bytes, probed)
    runners, skipped, build_s, tuning = build_runners(config, settings, strategies, ctx,
                                              slow["delay_per_sample_s"] if slow and slow["rank"] == rank else 0.0,
                                              jitter, plan_inputs)
    log_rank0(rank, "built " + ", ".join(f"{n} ({build_s[n]:.1f} s)" if n in build_s else n for n in runners) + "; warming up")
    t_start = time.time()
    from caramel.bench.wire import WireMeter, merge_ranks
    # a namespace of its own per worker: its interfaces' counters are this worker's bytes on the wire
    # (not with several ranks per host: they share the namespace's counters)
    wire = WireMeter() if str(job.get("network", "")).startswith("netns") and local == 1 else None
    trace = TraceClock.from_job(job, rank)
    times = measure_rounds(runners, settings, config.label, rank, trace=trace, wire=wire)
    measure_wall_s = time.time() - t_start
    stats = {n: _jsonable(r.stats()) for n, r in runners.items()}
    if profile is None:
        profile, together, grad_bytes = _job_profile(config, settings, device, strategies)
        # the collectives' fixed costs on these links, for the predictions (after the rounds: it
        # perturbs nothing measured)
        probed = probe_link(grad_bytes, device, dist.get_backend(), world)
    # the workload's facts from the compute-only baseline's copy (its hooks add no parameters)
    workload = runners["compute"]
    # how the links carry a parameter server's traffic (the ps model's queues and all-to-all rate)
    traffic = probe_traffic(grad_bytes, device, world) if dist.get_backend() == "gloo" else None
    # several ranks per host: the rate within a host, and the layout the hierarchical ps model reads
    # on every backend: without it the model would take the link's rate for the node stage
    node = probe_node_rate(grad_bytes, local, device=device) if local > 1 else None
    layout = ({"workers_per_node": local, "backend": dist.get_backend(),
               **({"node_bandwidth_bps": node["node_bandwidth_bps"], "node_probe": node} if node else {})}
              if local > 1 else None)

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, times)
    wire_ranks: list[Any] = [None] * world
    dist.all_gather_object(wire_ranks, wire.totals() if wire is not None else None)
    spans: list[Any] = [None] * world
    dist.all_gather_object(spans, runners["concurrent"].spans)
    paused: list[Any] = [None] * world  # --jitter: each compute-only step's own pause
    concurrent_padding: list[Any] = [None] * world  # --jitter: each concurrent step's padding
    if jitter:
        dist.all_gather_object(paused, runners["compute"].paused_s)
        dist.all_gather_object(concurrent_padding, runners["concurrent"].padding)
    stamps: list[Any] = [None] * world
    if trace is not None:
        dist.all_gather_object(stamps, trace.stamps)
    if rank != 0:
        return None
    comm_s = median(job_step_times([g["comm"] for g in gathered], settings.steps_per_round))
    # the configuration's uneven workers, as the predictions' cluster carries them (`caramel.bench.hetero_prediction`)
    hetero = job_heterogeneity(config.slow_link, jitter, slow, int(workload.inputs.shape[0]),
                               [g["compute"] for g in gathered], paused, concurrent_padding, settings.steps_per_round)
    names = [s.name for s in strategies if s.name in runners]
    concrete = as_screened(names, tuning)  # a tuned strategy is predicted as the value it runs
    if ctx.trace_dir:  # the predictions' inputs, to replay them offline (experiments/predict_saved_inputs.py)
        save_prediction_inputs(Path(ctx.trace_dir) / PREDICTION_INPUTS, profile, world, grad_bytes, comm_s,
                               runners["comm"].stats().get("buckets", 1), [median(g["compute"]) for g in gathered],
                               spans, probed, hetero, traffic, concrete, config.label, layout)
    bandwidth_bps = effective_bandwidth_bps(grad_bytes, world, comm_s)
    compute_medians = [median(g["compute"]) for g in gathered]
    predictions = predictions_by_name(job_predictions(profile, list(dict.fromkeys(concrete.values())), world, grad_bytes,
                                                      comm_s, runners["comm"].stats().get("buckets", 1),
                                                      compute_medians, spans, probed, traffic, hetero, layout),
                                      concrete)
    from caramel.bench.pipeline_plan import cut_mismatches
    return {
        "format": format_tag(RAW_KIND),
        "config": config.to_dict(),
        "settings": vars(settings).copy(),
        "strategies": [s.to_dict() for s in strategies],
        "skipped": skipped,
        "runners": list(runners),
        "step_times_s": {n: [g[n] for g in gathered] for n in runners},
        # how each block started and ended (`caramel.bench.blocks`): the report's T follows drain_timed
        "blocks": {n: {"entry_steps": r.entry_steps, "drain_timed": r.drain_timed} for n, r in runners.items()},
        "stats": stats,
        "wire_tx": merge_ranks(wire_ranks) if wire is not None else None,
        "lower_bound_s": lower_bound_s(together, world, grad_bytes, comm_s),
        "tuning": tuning,
        **predictions,
        "pipeline_plan_mismatch": cut_mismatches({n: stats[n] for n in names if n in stats},
                                                 predictions.get("predicted") or {}),
        "meta": {
            "world_size": world,
            "network": job.get("network", "unknown"),
            "backend": dist.get_backend(),
            "device": str(device),
            "torch": torch.__version__,
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "threads_per_worker": torch.get_num_threads(),
            "param_count": param_count(workload.model),
            "grad_bytes": grad_bytes,
            "effective_bandwidth_bps": bandwidth_bps,
            "load_average": os.getloadavg(),
            "comm_buckets": runners["comm"].stats().get("buckets"),
            "measure_wall_s": measure_wall_s,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
            "slow_worker": slow,
            "jitter": jitter,
            "slow_link": config.slow_link,
            "local_batch": int(workload.inputs.shape[0]),
            "nproc_per_node": local,
            **({"node_probe": node} if node else {}),
        },
        **({"step_stamps_s": {n: [s[n] for s in stamps] for n in runners},
            "bandwidth_trace": {"phases": job["bandwidth_trace"]["phases"]}} if trace is not None else {}),
    }


def _job_profile(config: BenchConfig, settings: BenchSettings, device: torch.device,
                 strategies: list[Strategy]) -> tuple[Any, Any, int]:
    """The workload's profiles and gradient bytes (`caramel.bench.job_profile`): this rank's,
    taken in turns with its host's other ranks (the predictions'), and the one taken with
    every rank at once (the lower bound's: compute under the rounds' contention)."""
    from caramel.bench.job_profile import job_profile

    # a pipeline's microbatches pay a fixed cost per call: time the modules at a quarter batch too
    probe = make_workload(config, settings.seed, device)
    batch = int(probe.inputs.shape[0]) if getattr(probe.inputs, "dim", lambda: 0)() > 0 else 1
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable_params(probe.model))
    del probe  # one model copy at a time while profiling (a GPU holds few)
    pipelines = any(s.kind == "pipeline" for s in strategies)
    small = batch // 4 if pipelines and batch >= 4 else None
    # throwaway copies (profiling trains them); in turns only for a pipeline (`job_profile`)
    profile, together = job_profile(lambda: make_workload(config, settings.seed, device), small, turns=pipelines)
    log_rank0(dist.get_rank(), "profiled for the lower bound and the predictions"
              + (f" ({sharing_note(profile)})" if profile is not None else ""))
    return profile, together, grad_bytes


def save_prediction_inputs(path: Path, profile, world: int, grad_bytes: int, comm_s: float, buckets: int,
                           rank_compute_s: list[float], spans: list[Any], probed: dict[str, Any] | None,
                           hetero: Heterogeneity | None = None, traffic: dict[str, Any] | None = None,
                           screened: dict[str, str] | None = None, config: str | None = None,
                           layout: dict[str, Any] | None = None) -> None:
    """What `job_predictions` takes, as JSON: a later model can be replayed on this job's
    measurements without running it again. `traffic`: the ps traffic probe; `screened`: each
    strategy's name as predicted (a tuned one's chosen value); `config`: the configuration's
    label, to pair the inputs with its records; `layout`: ranks per host and the rate within one
    (several ranks per host), the predictions' cluster meta."""
    path.write_text(json.dumps(_jsonable({
        "profile": profile.to_dict(), "world": world, "grad_bytes": grad_bytes, "comm_s": comm_s,
        "comm_buckets": buckets, "rank_compute_s": rank_compute_s, "spans": spans, "probed": probed,
        "heterogeneity": hetero.to_dict() if hetero else None, "traffic": traffic, "screened": screened,
        "config": config, "layout": layout})))


def _jsonable(value: Any) -> Any:
    """Engine stats may hold numpy/torch scalars or tuples; keep what JSON can hold."""
    try:
        return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    except (TypeError, ValueError):
        return str(value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m caramel.bench.harness JOB.json OUT.json", file=sys.stderr)
        return 2
    job = read_json(argv[0], JOB_KIND)
    raw = run_job(job)
    if dist.is_initialized():
        # Every rank leaves together: a rank that tears gloo down while a peer still works
        # (rank 1 right after the calibration's gather) can abort in gloo's threads.
        dist.barrier()
        dist.destroy_process_group()
    if raw is not None:
        write_json(argv[1], raw)
        log_rank0(0, "results written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
