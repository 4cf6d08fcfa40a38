"""Validate the simulator against real runs on the emulated cluster: `python -m experiments.validation.run`.

    python -m experiments.validation.run --json validation.json --markdown table.md

What it does, in this order, with nothing refitted after a prediction is made:

1. per cluster size, once, before any configuration: build the emulated cluster (a network
   namespace per worker, links shaped with tc) and *calibrate* it: time all-reduces over a sweep
   of sizes (`caramel cluster probe`'s worker, mean of 15 repetitions per size) at one reference rate and fit the two network
   numbers the simulator needs, the per-step latency alpha and the goodput factor (the share of
   the tc rate that TCP payload gets; see `fit_calibration`), and measure the two interference
   factors of `caramel.sim.interference` on a fixed reference step;
2. per model, one job (`experiments.validation.worker`): every rank profiles the model side by
   side, rank 0 plans and simulates every configuration of that model on
   `ClusterSpec(rate x goodput, alpha)` and writes the predictions to disk, then every bandwidth
   is shaped in turn and its strategies are timed in interleaved rounds;
3. each configuration becomes a `ValidationRecord` (predicted step time, every measured step,
   the per-round medians as the run-to-run spread) and `experiments.validation.compare.score` scores them.

Every record is scored twice: against the plain simulator's prediction and against the one with
the interference term. The default matrix (`DEFAULT_GROUPS`) has 33 configurations: 4 models
(ResNet-18 on 2 and on 4 workers), 50 Mbit/s to 1 Gbit/s,
the fifo/fusion/caramel planners in forward/backward/none overlap, several bucket caps, torch
DDP, 2 and 4 workers. `--quick` runs 2 configurations on loopback (the test smoke run).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from caramel.errors import CaramelError
from caramel.jsonio import atomic_write_text, format_tag, read_json, write_json
from experiments.validation.compare import ValidationConfig, ValidationRecord, ValidationReport, score
from experiments.validation.tables import (compare_runs, compare_table, consensus_floor, floor_table, interference_records,
                                         markdown_table)
from experiments.validation.worker import INTERFERENCE_KIND, JOB_KIND, RAW_KIND, done_path, request_path
from caramel.units import format_rate, parse_duration_arg_s, parse_rate_bps

WORKER_MODULE = "experiments.validation.worker"
NETWORKS = ("cluster", "loopback")
VALIDATION_MTU = 9000  # the emulated links' frames in every validation (see run_validation)
CALIBRATION_BPS = 200e6  # the rate the probe fits the cluster's latency and goodput at
# Probe sizes: the bucket sizes plans actually send (64 KiB .. 8 MiB), 1 KiB messages for alpha.
CALIBRATION_SIZES = [1024, 65536, 262144, 1048576, 2097152, 4194304, 8388608]
# The interference reference: a fixed small MLP step against 2 MiB all-reduces, the same for every model.
INTERFERENCE_REFERENCE = {"model": "mlp", "batch_size": 32, "model_options": {"width": 512, "depth": 4},
                          "bytes": 2 * 1024 * 1024, "collectives": 6, "reps": 3}


@dataclass(frozen=True)
class StrategySpec:
    """One strategy: planner (`fifo`, `fusion`, `caramel`, or `ddp` for torch DDP), overlap, options."""

    planner: str
    overlap: str = "forward"
    options: tuple[tuple[str, Any], ...] = ()


@dataclass
class ModelGroup:
    """One model on one cluster size, at several bandwidths, each with the same strategies: one job."""

    model: str
    batch_size: int
    workers: int
    bandwidths: list[str]
    strategies: list[StrategySpec]
    model_options: dict[str, Any] = field(default_factory=dict)

    def configs(self, latency_s: float) -> list[ValidationConfig]:
        return [ValidationConfig(self.label, self.workers, parse_rate_bps(bw), latency_s, s.planner,
                                 "backward" if s.planner == "ddp" else s.overlap, dict(s.options))
                for bw in self.bandwidths for s in self.strategies]

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.model_options.items()))
        return f"{self.model}({opts + ',' if opts else ''}b={self.batch_size})"


@dataclass
class ValidationSettings:
    """How each configuration is timed (the bench harness's scheme, smaller)."""

    warmup_steps: int = 2
    rounds: int = 3
    steps_per_round: int = 4
    profile_steps: int = 10  # a median of 3 steps moved 10-20% between runs on this host
    lr: float = 0.01
    seed: int = 0
    timeout_s: float = 120.0  # process-group timeout; a job's wall-clock limit is 10x this
    compute_baseline: bool = True  # also time compute-only steps (no communication) once per job

    def __post_init__(self) -> None:
        for name in ("rounds", "steps_per_round", "profile_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CaramelError(f"{name} must be a positive integer, got {v!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise CaramelError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")


@dataclass
class Calibration:
    """The network numbers fitted once per cluster size, before any prediction."""

    workers: int
    latency_s: float
    goodput: float  # achieved payload rate / tc rate
    source: str
    probe: dict[str, Any] = field(default_factory=dict)
    compute_slowdown: float = 1.0  # caramel.sim.interference: compute while a collective streams
    comm_slowdown: float = 1.0  # ... and a collective while compute runs
    interference: dict[str, Any] = field(default_factory=dict)
    queued_latency_s: float | None = None  # a collective queued behind another (ClusterSpec); None: latency_s


def _s(planner: str, overlap: str = "forward", **options: Any) -> StrategySpec:
    return StrategySpec(planner, overlap, tuple(sorted(options.items())))


_CORE = [_s("fifo", "backward"), _s("fifo", "forward"), _s("caramel", "forward"), _s("caramel", "none")]
DEFAULT_GROUPS: list[ModelGroup] = [
    # 2 workers: an MLP (few large tensors) from comm-bound to balanced, with bucket caps.
    ModelGroup("mlp", 32, 2, ["50mbit", "200mbit"],
               [_s("fifo", "backward", bucket_cap_mb=0.25), _s("fifo", "forward", bucket_cap_mb=0.25),
                _s("fifo", "forward", bucket_cap_mb=4.0), _s("caramel", "forward")],
               {"width": 512, "depth": 4}),
    # ResNet-18/16: many small tensors; the DESIGN's comm-bound and compute-bound rates.
    ModelGroup("resnet18", 8, 2, ["125mbit", "500mbit"],
               _CORE + [_s("fusion", "forward"), _s("ddp")], {"width": 16}),
    ModelGroup("vgg16", 8, 2, ["200mbit"], _CORE + [_s("fifo", "forward", bucket_cap_mb=1.0)], {"width_div": 4}),
    ModelGroup("gpt2", 2, 2, ["1gbit"], _CORE + [_s("ddp")]),
    # 4 workers sharing the 2 cores.
    ModelGroup("resnet18", 4, 4, ["250mbit"], [_s("fifo", "backward"), _s("fifo", "forward"), _s("caramel", "forward")],
               {"width": 16}),
]
# Deferred weight gradients (compute_schedule forced to k layers, beside k = 0): the simulator's
# replay of a deferred backward, on configurations it was not calibrated on.
DEFERRAL_GROUPS: list[ModelGroup] = [
    ModelGroup("resnet18", 8, 2, ["125mbit", "500mbit"],
               [_s("caramel", "forward", compute_schedule="off"), _s("caramel", "forward", compute_schedule=2),
                _s("caramel", "forward", compute_schedule=8)], {"width": 16}),
    ModelGroup("gpt2", 2, 2, ["500mbit", "1gbit"],
               [_s("caramel", "forward", compute_schedule="off"), _s("caramel", "forward", compute_schedule=4),
                _s("caramel", "forward", compute_schedule=9)]),
]
MATRICES = {"default": DEFAULT_GROUPS, "deferral": DEFERRAL_GROUPS}
DEFAULT_SETTINGS = ValidationSettings()
QUICK_GROUPS: list[ModelGroup] = [
    ModelGroup("mlp", 8, 2, ["100mbit"], [_s("fifo", "backward"), _s("caramel", "forward")], {"width": 64, "depth": 3}),
]
QUICK_SETTINGS = ValidationSettings(warmup_steps=1, rounds=2, steps_per_round=2, profile_steps=1, compute_baseline=False)


def fit_calibration(sizes_bytes: list[int], times_s: list[float], workers: int, nominal_bps: float,
                    large_bytes: int = 256 * 1024) -> tuple[float, float]:
    """(latency_s, goodput) from probe times t(S) = 2(n-1)*alpha + 2(n-1)/n * 8S / (goodput * rate).

    Two stages, each number from the messages that determine it: alpha from the smallest
    message (its time less its transfer at the tc rate: what one collective costs however
    small), then goodput from the messages of at least `large_bytes` (least squares through
    the intercept alpha fixes). A single least-squares line lets the large messages push the
    intercept anywhere, even to zero, and the planner then takes small collectives for free.
    """
    if len(set(sizes_bytes)) < 2 or len(sizes_bytes) != len(times_s):
        raise CaramelError("calibration needs probe times for at least two different sizes")
    if any(not t > 0 for t in times_s):
        raise CaramelError(f"calibration: probe times must be positive, got {times_s}")
    n = workers
    per_byte_nominal = 2 * (n - 1) / n * 8 / nominal_bps
    s0, t0 = min(zip(sizes_bytes, times_s))
    intercept = max(0.0, t0 - s0 * per_byte_nominal)
    large = [(s, t - intercept) for s, t in zip(sizes_bytes, times_s) if s >= large_bytes and s != s0]
    if not large:
        raise CaramelError(f"calibration needs probe times for messages of at least {large_bytes} bytes")
    slope = sum(s * y for s, y in large) / sum(s * s for s, _ in large)
    if not slope > 0:
        raise CaramelError("calibration: probe times do not grow with message size (is the link shaped?)")
    return intercept / (2 * (n - 1)), per_byte_nominal / slope


def calibrate(cluster, reference_bps: float, reps: int = 15, log: TextIO | None = None) -> Calibration:
    """Probe all-reduces on the emulated cluster at `reference_bps` and fit alpha and goodput once.

    The fit takes each size's *mean* time over `reps` repetitions (of the slowest rank), the
    cost a plan pays per collective on average. The fastest repetition hides the host's
    wake-up latency: on the 2-core test host a 4 KiB all-reduce took 0.3-0.5 ms at best and
    2-4 ms in half of the repetitions (a sleeping gloo thread on an idle virtual CPU), so
    alpha from the fastest times made a 14-bucket plan look 25-40 ms faster than it ran.
    """
    from caramel.topology.probe import probe_cluster, queued_latency_from_extra_s

    for i in range(cluster.workers):
        cluster.set_bandwidth(i, reference_bps)
    spec, fit = probe_cluster(cluster, sizes_bytes=CALIBRATION_SIZES, reps=reps, out=log)
    # fit.times_s: each size's mean (the probe's summary)
    latency_s, goodput = fit_calibration(fit.sizes_bytes, fit.times_s, cluster.workers, reference_bps)
    inter = measure_interference(cluster, log=log)
    # the probe's back-to-back pieces: what each extra queued collective adds, per message, at
    # most the lone collective's latency fitted here
    queued = spec.meta["probe"].get("queued")
    queued_s = queued_latency_from_extra_s(queued["queued_extra_s"], latency_s, cluster.workers) if queued else None
    return Calibration(cluster.workers, latency_s, goodput, f"probe at {format_rate(reference_bps)} (mean of {reps})",
                       {"sizes_bytes": fit.sizes_bytes, "times_s": fit.times_s,
                        "fastest_times_s": spec.meta["probe"]["fastest_times_s"],
                        "reference_bps": reference_bps, "queued": queued,
                        "probe_fit": {"latency_s": fit.latency_s, "bandwidth_bps": fit.bandwidth_bps}},
                       inter["compute_slowdown"], inter["comm_slowdown"], inter, queued_s)


def measure_interference(cluster, settings: ValidationSettings = DEFAULT_SETTINGS, log: TextIO | None = None) -> dict[str, Any]:
    """Run the interference job (`validate_worker.measure_interference`) once on the cluster as it is shaped."""
    with tempfile.TemporaryDirectory(prefix="caramel-interference-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        write_json(job_path, {"format": format_tag(INTERFERENCE_KIND), **INTERFERENCE_REFERENCE,
                              "seed": settings.seed, "lr": settings.lr, "timeout_s": settings.timeout_s})
        rc = cluster.run([sys.executable, "-m", WORKER_MODULE, str(job_path), str(out_path)],
                         env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, timeout_s=5 * settings.timeout_s, out=log)
        if rc != 0 or not out_path.exists():
            raise CaramelError(f"the interference calibration job failed (exit code {rc}); see the worker output above")
        return read_json(out_path, INTERFERENCE_KIND + "_result")


def make_job(group: ModelGroup, settings: ValidationSettings, calibration: Calibration, ctl_dir: str) -> dict[str, Any]:
    """The job file every rank of one model's job reads."""
    configs = []
    for cfg in group.configs(calibration.latency_s):
        configs.append({"name": cfg.strategy(), "planner": cfg.planner, "overlap": cfg.overlap,
                        "options": cfg.options, "bandwidth_bps": cfg.bandwidth_bps})
    return {"format": format_tag(JOB_KIND), "model": group.model, "batch_size": group.batch_size,
            "model_options": group.model_options, "workers": group.workers, "configs": configs,
            "calibration": {"latency_s": calibration.latency_s, "goodput": calibration.goodput,
                            "compute_slowdown": calibration.compute_slowdown, "comm_slowdown": calibration.comm_slowdown,
                            "queued_latency_s": calibration.queued_latency_s},
            "ctl_dir": ctl_dir, **asdict(settings)}


class _BandwidthServer:
    """Host side of the reshaping handshake: answers rank 0's request files (see validate_worker)."""

    def __init__(self, ctl_dir: str, reshape: Callable[[float], None]):
        self.ctl_dir, self.reshape = ctl_dir, reshape
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        index = 0
        while not self.stop.is_set():
            req = request_path(self.ctl_dir, index)
            try:
                bps = float(req.read_text())
            except (FileNotFoundError, ValueError):  # not there yet
                time.sleep(0.02)
                continue
            try:
                self.reshape(bps)
            except BaseException as e:  # the worker times out waiting and reports it
                self.error = e
                return
            atomic_write_text(done_path(self.ctl_dir, index), "ok\n")
            index += 1

    def __enter__(self) -> "_BandwidthServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def _run_loopback(workers: int, argv: list[str], timeout_s: float, log: TextIO) -> int:
    """Plain local processes on 127.0.0.1, no shaping (the smoke test's network).

    The rendezvous store is hosted here, bound to a port the kernel picks, and the workers join
    it as torchrun's workers join their agent's: a port chosen free and bound later by rank 0
    can be taken in between by another job on the host (EADDRINUSE)."""
    from caramel.cluster.local import worker_env
    from caramel.cluster.launch import NodeProcess, supervise
    from caramel.distributed import host_store

    store = host_store(timeout_s)
    nodes = []
    for rank in range(workers):
        env = worker_env(threads=1)
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_WORLD_SIZE=str(workers),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                   TORCHELASTIC_USE_AGENT_STORE="True")
        nodes.append(NodeProcess(f"rank{rank}", argv, env))
    try:
        return supervise(nodes, out=log, timeout_s=timeout_s)
    finally:
        del store  # the server stops with its last reference


def run_group(group: ModelGroup, settings: ValidationSettings, calibration: Calibration, cluster=None,
              log: TextIO | None = None) -> tuple[list[ValidationRecord], dict[str, Any]]:
    """Run one model's job (on `cluster`, or on loopback when None); records and what else was learned."""
    log = log if log is not None else sys.stderr
    with tempfile.TemporaryDirectory(prefix="caramel-validate-") as ctl:
        job = make_job(group, settings, calibration, ctl)
        job_path, out_path = Path(ctl) / "job.json", Path(ctl) / "raw.json"
        write_json(job_path, job)
        argv = [sys.executable, "-m", WORKER_MODULE, str(job_path), str(out_path)]
        timeout_s = 10 * settings.timeout_s

        def reshape(bps: float) -> None:
            if cluster is not None:
                for i in range(cluster.workers):
                    cluster.set_bandwidth(i, bps)

        t0 = time.time()
        with _BandwidthServer(ctl, reshape) as server:
            if cluster is None:
                rc = _run_loopback(group.workers, argv, timeout_s, log)
            else:
                env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
                rc = cluster.run(argv, env=env, timeout_s=timeout_s, out=log)
        if server.error is not None:
            raise CaramelError(f"{group.label}: reshaping the links failed: {server.error}")
        if rc != 0 or not out_path.exists():
            raise CaramelError(f"{group.label}: the validation job failed (exit code {rc}); see the worker output above")
        raw = read_json(out_path, RAW_KIND)
        predicted_at = read_json(Path(ctl) / "predictions.json", "validation_predictions")["written_at"]
    return records_from_raw(group, calibration, raw, predicted_at, wall_s=time.time() - t0)


def records_from_raw(group: ModelGroup, calibration: Calibration, raw: dict[str, Any], predicted_at: float,
                     wall_s: float = 0.0) -> tuple[list[ValidationRecord], dict[str, Any]]:
    """Per configuration: prediction, every step (the advance of the slowest rank's clock,
    `caramel.bench.report.job_step_times`), per-round medians; the compute-only baseline at its
    pace per round (`free_running_pace_s`: its ranks never wait for one another)."""
    from caramel.bench.report import free_running_pace_s, job_step_times

    configs = group.configs(calibration.latency_s)
    preds = raw["predictions"]
    assert len(configs) == len(preds) == len(raw["configs"]), "raw results do not match the group"
    records: list[ValidationRecord] = [None] * len(configs)  # type: ignore[list-item]
    details: list[dict[str, Any]] = [{}] * len(configs)
    compute_only: list[float] = []
    for step in raw["measured"]:  # one per bandwidth; step[r] is rank r's result
        keys = list(step[0]["times"])
        for key in keys:
            per_round = [[rank["times"][key][k] for rank in step] for k in range(len(step[0]["times"][key]))]
            if key == "compute":
                compute_only = [free_running_pace_s(ranks)[0] for ranks in per_round]
                continue
            rounds = [job_step_times(ranks) for ranks in per_round]
            i = int(key)
            steps = [t for r in rounds for t in r]
            records[i] = ValidationRecord(configs[i], preds[i]["predicted_step_time_s"], steps,
                                          [statistics.median(r) for r in rounds])
            stats = step[0]["stats"].get(key, {})
            ran = stats.get("plan_fingerprint")
            details[i] = {k: v for k, v in preds[i].items()}
            details[i]["engine_plan_fingerprint"] = ran
            details[i]["plan_matches"] = ran is None or ran == preds[i]["plan_fingerprint"]
            if not details[i]["plan_matches"]:
                raise CaramelError(f"{group.label} {configs[i].strategy()}: the engine ran plan {ran}, "
                                   f"not the simulated {preds[i]['plan_fingerprint']}")
    missing = [configs[i].strategy() for i, r in enumerate(records) if r is None]
    if missing:
        raise CaramelError(f"{group.label}: no measurements for {', '.join(missing)}")
    info = {"model": group.label, "workers": group.workers, "predicted_at": predicted_at,
            "measure_started_at": raw["measure_started_at"],
            "profile_compute_s": preds[0]["predicted_compute_s"] if preds else None,
            "compute_only_measured_s": statistics.median(compute_only) if compute_only else None,
            "load_average": raw["meta"].get("load_average"), "wall_s": wall_s, "details": details,
            "compute_slowdown_by_bps": raw.get("slowdowns")}
    return records, info


def run_validation(groups: list[ModelGroup], settings: ValidationSettings, network: str = "cluster",
                   calibrations: dict[int, Calibration] | None = None, log: TextIO | None = None,
                   checkpoint: str | None = None) -> ValidationReport:
    """Calibrate once per cluster size (unless given), then run every group; the scored report.

    A group whose job fails is listed in `meta["failed"]` and the others still run; with
    `checkpoint`, the report so far is saved after every group.
    """
    if network not in NETWORKS:
        raise CaramelError(f"network {network!r}: expected one of {', '.join(NETWORKS)}")
    log = log if log is not None else sys.stderr
    calibrations = dict(calibrations or {})
    records: list[ValidationRecord] = []
    jobs: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    t0 = time.time()

    def report() -> ValidationReport:
        meta = {"network": "netns+tc" if network == "cluster" else "loopback (unshaped)", "settings": asdict(settings),
                "calibrations": {str(k): asdict(v) for k, v in calibrations.items()}, "jobs": jobs, "failed": failed,
                "wall_s": time.time() - t0, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t0))}
        rep = ValidationReport(list(records), meta)
        meta["interference_score"] = score(interference_records(rep)) if records else None
        return rep

    def run_one(g: ModelGroup, cluster) -> None:
        print(f"[validate] {g.label} on {g.workers} workers: {len(g.strategies) * len(g.bandwidths)} configurations",
              file=log, flush=True)
        try:
            recs, info = run_group(g, settings, calibrations[g.workers], cluster, log)
        except CaramelError as e:
            print(f"[validate] {g.label}: {e}", file=log, flush=True)
            failed.append({"model": g.label, "workers": str(g.workers), "error": str(e)})
        else:
            records.extend(recs)
            jobs.append(info)
        if checkpoint:
            report().save(checkpoint)

    for workers in sorted({g.workers for g in groups}):
        mine = [g for g in groups if g.workers == workers]
        if network == "loopback":
            if workers not in calibrations:
                raise CaramelError(f"network loopback cannot calibrate; give a calibration for {workers} workers")
            for g in mine:
                run_one(g, None)
            continue
        from caramel.cluster.config import ClusterConfig
        from caramel.cluster.emulated import EmulatedCluster

        first = parse_rate_bps(mine[0].bandwidths[0])
        # 9000-byte frames, as in every scored run: runs ad and ae tried one cluster per group at
        # its slowest rate's auto MTU and scored worse (docs/simulator.md, "Frames")
        with EmulatedCluster(ClusterConfig(workers=workers, bandwidth_bps=first, fallback="error", quiet=True,
                                           mtu=VALIDATION_MTU)) as cluster:
            if workers not in calibrations:
                print(f"[validate] calibrating {workers} workers", file=log, flush=True)
                calibrations[workers] = calibrate(cluster, CALIBRATION_BPS, log=log)
            for g in mine:
                run_one(g, cluster)
    if not records:
        raise CaramelError("no configuration was measured: " + "; ".join(f["error"] for f in failed))
    return report()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.validation.run",
                                description="Predict, then run, every configuration on the emulated cluster; score the simulator.")
    p.add_argument("--json", metavar="OUT", help="write the report (caramel.validation/1); required for a run")
    p.add_argument("--table", metavar="REPORT.json", help="print the Markdown table of a saved report (no run)")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="print how far two saved runs of the same matrix differ (no run)")
    p.add_argument("--floor", nargs="+", metavar="RUN.json",
                   help="score each saved run against the median of the others' measurements, beside the simulator (no run)")
    p.add_argument("--markdown", metavar="OUT", help="also write the table as Markdown")
    p.add_argument("--quick", action="store_true", help="2 configurations, few steps (the smoke test)")
    p.add_argument("--matrix", choices=sorted(MATRICES), default="default",
                   help="default: the planners and overlaps; deferral: compute_schedule forced to k layers")
    p.add_argument("--network", choices=NETWORKS, default="cluster",
                   help="cluster: netns + tc shaping (needs root); loopback: unshaped, needs --latency and --goodput")
    p.add_argument("--latency", help="alpha instead of calibrating (loopback), with its unit (100us, 0.1ms)")
    p.add_argument("--goodput", type=float, help="goodput factor instead of calibrating (loopback)")
    p.add_argument("--rounds", type=int, help="interleaved rounds per bandwidth")
    p.add_argument("--steps", type=int, help="timed steps per strategy per round")
    args = p.parse_args(argv)
    try:
        if args.table or args.compare or args.floor:
            if args.floor:
                print(floor_table(consensus_floor({Path(f).stem: ValidationReport.load(f) for f in args.floor})))
            if args.table:
                print(markdown_table(ValidationReport.load(args.table)))
            if args.compare:
                print(compare_table(compare_runs(*(ValidationReport.load(f) for f in args.compare))))
            return 0
        if not args.json:
            raise CaramelError("--json OUT is required for a run (the report is saved there after every model)")
        groups = QUICK_GROUPS if args.quick else MATRICES[args.matrix]
        base = QUICK_SETTINGS if args.quick else DEFAULT_SETTINGS
        settings = ValidationSettings(**{**asdict(base), **({"rounds": args.rounds} if args.rounds else {}),
                                         **({"steps_per_round": args.steps} if args.steps else {})})
        cals = None
        if (args.latency is None) != (args.goodput is None):
            raise CaramelError("--latency and --goodput go together (both replace the calibration)")
        if args.latency is not None:
            latency_s = parse_duration_arg_s(args.latency, "--latency")
            if not args.goodput > 0:
                raise CaramelError(f"--goodput must be a positive factor, got {args.goodput:g}")
            cals = {g.workers: Calibration(g.workers, latency_s, args.goodput, "given") for g in groups}
        report = run_validation(groups, settings, args.network, cals, checkpoint=args.json)
    except CaramelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report.save(args.json)
    table = markdown_table(report)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    print(f"wrote {args.json}; targets met (plain simulator): {score(report.records)['targets_met']}, "
          f"with the interference term: {report.meta['interference_score']['targets_met']}")
    if report.meta["failed"]:
        print(f"error: {len(report.meta['failed'])} group(s) failed: "
              + "; ".join(f"{f['model']}: {f['error']}" for f in report.meta["failed"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
