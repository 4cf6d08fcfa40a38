"""`caramel bench`: DDP and Caramel strategies side by side, one job per configuration.

Without selection flags it runs the default matrix (or `--quick`), whose points are defined by
comm/compute ratios and get their link rates at run start; `--model`, `--workers`, `--ratio`
or `--bandwidth` (a pinned rate), `--batch-size` select one configuration. Prints a table and a
summary; `--json OUT` and `--markdown OUT` write the records and the report (docs/results/).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
import time
from typing import Any

from caramel.bench.bandwidth_trace import BandwidthTrace, load_trace
from caramel.bench.evidence import attach_evidence
from caramel.bench.harness import make_calibration_job, make_job
from caramel.bench.hetero import describe, format_versus, versus_best_allreduce
from caramel.bench.jobs import LOOPBACK, NETWORKS, choose_network, launch_job
from caramel.bench.phases import format_phases, phase_results
from caramel.bench.provenance import code_version
from caramel.bench.matrix import (DEFAULT_MATRIX, DEFAULT_SETTINGS, DEFAULT_STRATEGIES, QUICK_MATRIX, QUICK_SETTINGS,
                                  QUICK_STRATEGIES, BenchConfig, BenchSettings, parse_strategies)
from caramel.bench.rates import CALIBRATION_RATE, calibration_settings, derive_rates, rate_text
from caramel.bench.report import FORMAT, Record, config_label, summarize, summarize_strategies, write_records
from caramel.bench.tables import (format_markdown, format_predictions, format_summary, format_table, format_tuning,
                                  format_uneven)
from caramel.errors import CaramelError
from caramel.jsonio import atomic_write_text
from caramel.models.zoo import get_model
from caramel.strategies.options import parse_value

DEFAULT_TIMEOUT_S = 600.0  # --timeout: wall-clock limit per configuration

def add_arguments(p: argparse.ArgumentParser) -> None:
    sel = p.add_argument_group("one configuration (instead of the default matrix)")
    sel.add_argument("--model", help="zoo model name or path/to/file.py:factory")
    sel.add_argument("--workers", type=int, help="number of workers (processes), default 2; with --nproc-per-node: hosts")
    sel.add_argument("--nproc-per-node", type=int, metavar="K",
                     help="K ranks on each of the --workers emulated hosts, sharing its link (default 1; needs a "
                          "pinned --bandwidth; ps:hierarchical=true aggregates within a host)")
    sel.add_argument("--ratio", type=float, metavar="R",
                     help="target comm/compute, e.g. 1: the link rate is derived at run start from the measured compute "
                          "time and the gradient bytes (needs 2+ workers and the emulated cluster)")
    sel.add_argument("--bandwidth", help="pin the per-worker link rate instead, in tc syntax, e.g. 300mbit (what-ifs)")
    sel.add_argument("--batch-size", type=int, help="per-worker batch size (default: the model's)")
    sel.add_argument("--slow-worker", metavar="RANK:FACTOR",
                     help="emulate a straggler: that worker's compute FACTOR times slower (a calibrated delay), "
                          "e.g. 1:2")
    sel.add_argument("--slow-link", metavar="RANK:FACTOR",
                     help="that worker's link at the others' rate / FACTOR, e.g. 2:4 (emulated cluster only)")
    sel.add_argument("--jitter", metavar="RANK:FRACTION[:SEED]",
                     help="that worker's step time varies by up to +/-FRACTION per step, seeded, e.g. 1:0.5:0 "
                          "(every worker padded to a nominal step; caramel.bench.hetero)")
    sel.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE",
                     help="extra zoo factory argument, e.g. width=16 (repeatable)")
    p.add_argument("--bandwidth-trace", metavar="FILE",
                   help="change the links' rate during the measured rounds: JSON [{\"duration_s\": 30, \"rate\": \"x1\"}, "
                        "{\"duration_s\": 30, \"rate\": \"x0.1\"}] or CSV duration_s,rate lines; xF is F times the "
                        "configuration's rate (--ratio or --bandwidth); rounds run until the last phase ends and the "
                        "report gives each phase's throughput (the emulated cluster, root)")
    p.add_argument("--quick", action="store_true",
                   help=f"the small matrix (under 3 minutes), by default with {','.join(QUICK_STRATEGIES)}: "
                        "without the tuned DDP, whose screening would about double it")
    p.add_argument("--strategies",
                   help="comma-separated: ddp, caramel, caramel:planner=fifo,overlap=backward, ... (default: "
                        f"{','.join(DEFAULT_STRATEGIES)}; every row is compared with the strongest DDP variant; "
                        "ddp:bucket_cap_mb=tuned screens bucket caps in the job and runs the fastest)")
    p.add_argument("--rounds", type=int, help="interleaving rounds per configuration")
    p.add_argument("--steps", type=int, help="measured steps per strategy per round")
    p.add_argument("--warmup", type=int, help="unmeasured warm-up steps per strategy")
    p.add_argument("--screen-rounds", type=int, metavar="N",
                   help="rounds of one block (--steps steps) per value when a strategy has a tuned option, e.g. "
                        "ddp:bucket_cap_mb=tuned: the job screens the values first and runs the fastest (default 4; "
                        "3 with --quick)")
    p.add_argument("--network", choices=NETWORKS, default="auto",
                   help="cluster: shaped links (root); loopback: unshaped local workers; auto: cluster when possible")
    p.add_argument("--mtu", default="auto",
                   help="emulated links' MTU in bytes, or auto (default; see `caramel cluster run --help`)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"wall-clock limit per configuration, seconds (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--trace", metavar="DIR", help="write caramel strategies' timelines under DIR/<configuration>/")
    data = p.add_argument_group("data loading (instead of strategies): the plain loader vs caramel.data on a store")
    data.add_argument("--data", metavar="URL", help="the data set's store: a directory made by `caramel data make` "
                      "(served behind --store-rate) or an http(s)/s3 URL; uses --workers, --batch-size, --rounds")
    from caramel.bench.data_cli import add_loading_arguments

    add_loading_arguments(data, modes_flag="--data-modes", epochs_flag="--data-epochs")
    p.add_argument("--json", metavar="OUT", help=f"write the records and the summary ({FORMAT})")
    p.add_argument("--markdown", metavar="OUT", help="write the markdown report")


def model_options(items: list[str]) -> dict[str, Any]:
    """`--model-option KEY=VALUE` items as factory keywords (values through the one value parser)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CaramelError(f"--model-option {item!r}: expected KEY=VALUE, e.g. width=16")
        out[key.strip()] = parse_value(value.strip())
    return out


def select(args: argparse.Namespace) -> tuple[list[BenchConfig], BenchSettings]:
    """The configurations and settings the flags ask for (flags override the matrix's settings)."""
    single = (any(v is not None for v in (args.model, args.workers, args.bandwidth, args.batch_size, args.ratio,
                                          args.slow_worker, args.slow_link, args.jitter,
                                          # K = 1 is the default layout: the matrix, not one configuration
                                          None if getattr(args, "nproc_per_node", None) == 1
                                          else getattr(args, "nproc_per_node", None)))
              or args.model_option)
    base = QUICK_SETTINGS if args.quick else DEFAULT_SETTINGS
    settings = BenchSettings(
        rounds=args.rounds if args.rounds is not None else base.rounds,
        steps_per_round=args.steps if args.steps is not None else base.steps_per_round,
        warmup_steps=args.warmup if args.warmup is not None else base.warmup_steps,
        lr=base.lr, seed=base.seed, timeout_s=min(args.timeout, base.timeout_s),
        screen_rounds=args.screen_rounds if args.screen_rounds is not None else base.screen_rounds)
    if not single:
        return list(QUICK_MATRIX if args.quick else DEFAULT_MATRIX), settings
    if args.quick:
        raise CaramelError("--quick selects the quick matrix; it cannot be combined with --model/--workers/--ratio/--bandwidth/"
                           "--slow-worker/--slow-link/--jitter")
    return [single_config(args)], settings


def single_config(args: argparse.Namespace) -> BenchConfig:
    """The one configuration --model/--workers/--ratio/--bandwidth/... describe (the defaults:
    ResNet-18 at width 16, batch 8, 2 workers); `caramel tune --measure real` shares it."""
    if args.ratio is not None and args.bandwidth is not None:
        raise CaramelError(f"--ratio {args.ratio:g} and --bandwidth {args.bandwidth}: give one (a ratio derives the rate, "
                           "a bandwidth pins it)")
    if args.ratio is not None and not (math.isfinite(args.ratio) and args.ratio > 0):
        raise CaramelError(f"--ratio {args.ratio:g}: expected a positive comm/compute ratio, e.g. 1")
    workers = args.workers if args.workers is not None else 2
    per_node = getattr(args, "nproc_per_node", None)
    if per_node is not None:
        if per_node < 1:
            raise CaramelError(f"--nproc-per-node must be a positive integer (ranks per host), got {per_node}")
        if per_node > 1 and args.bandwidth is None:
            raise CaramelError(f"--nproc-per-node {per_node} needs a pinned --bandwidth (the hosts' link rate)")
        workers *= per_node  # the ranks
    if args.ratio is not None and workers < 2:
        raise CaramelError(f"--ratio needs --workers 2 or more (one worker sends nothing), got {workers}")
    model = args.model or "resnet18"
    options = model_options(args.model_option)
    if args.model is None and not options:
        options = {"width": 16}
    batch = args.batch_size if args.batch_size is not None else (8 if args.model is None else None)
    get_model(model)  # a bad name or path fails here, before any worker starts
    return BenchConfig(model=model, workers=workers, bandwidth=args.bandwidth, batch_size=batch, model_options=options,
                       comm_ratio=args.ratio, slow_worker=getattr(args, "slow_worker", None),
                       slow_link=getattr(args, "slow_link", None), jitter=getattr(args, "jitter", None),
                       nproc_per_node=per_node or 1)


def strategies_text(args: argparse.Namespace) -> str:
    """--strategies as given, else the defaults (--quick's leave the tuned DDP out)."""
    if args.strategies is not None:
        return args.strategies
    return ",".join(QUICK_STRATEGIES if args.quick else DEFAULT_STRATEGIES)


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (for the markdown report)."""
    parts = ["caramel", "bench"]
    for flag in ("model", "workers", "nproc_per_node", "ratio", "bandwidth", "bandwidth_trace", "batch_size", "slow_worker", "slow_link",
                 "jitter", "rounds", "steps", "warmup", "screen_rounds", "trace", "json", "markdown"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", f"{value:g}" if isinstance(value, float) else str(value)]
    for item in args.model_option:
        parts += ["--model-option", item]
    if args.quick:
        parts.append("--quick")
    if args.strategies is not None:
        parts += ["--strategies", args.strategies]
    if args.network != "auto":
        parts += ["--network", args.network]
    if args.mtu != "auto":
        parts += ["--mtu", str(args.mtu)]
    if args.timeout != DEFAULT_TIMEOUT_S:  # a run cut by its limit reads differently: keep it
        parts += ["--timeout", f"{args.timeout:g}"]
    return " ".join(shlex.quote(p) for p in parts)


def _network_for(args: argparse.Namespace, config: BenchConfig) -> str:
    """Where the configuration runs (a ratio-defined point runs where its derived rate will be shaped)."""
    return choose_network(args.network, config.bandwidth or (CALIBRATION_RATE if config.needs_rate else None))


def _calibration_launcher(args: argparse.Namespace, settings: BenchSettings):
    """Runs a compute-only job for a point under the same launcher, network and threads as its bench job."""
    cal = calibration_settings(settings)

    def launch(config: BenchConfig):
        network = _network_for(args, config)
        job = make_calibration_job(config, cal, network)
        return launch_job(job, config.workers, CALIBRATION_RATE if network == "cluster" else None, network,
                          timeout_s=args.timeout, strict=args.network == "cluster", mtu=args.mtu).raw
    return launch


def trace_config_name(model: str, workers: int, bandwidth: str | None) -> str:
    """A configuration's trace directory name less its index: the model's base name in safe
    characters, the workers and the rate (`loopback` without one); saved inputs pair by it."""
    model = model if ":" not in model else os.path.basename(model.rpartition(":")[0])
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    return f"{safe}-w{workers}-{bandwidth or 'loopback'}"


def _trace_subdir(root: str, index: int, config: BenchConfig) -> str:
    name = trace_config_name(config.model, config.workers, config.bandwidth)
    return os.path.join(os.path.abspath(root), f"{index:02d}-{name}")


def _trace_phases(trace: BandwidthTrace, config: BenchConfig) -> tuple[BenchConfig, list[dict[str, Any]]]:
    """The trace's phases in bits per second for `config` (x rates times its rate), and the
    configuration with a rate to build its links at (an absolute trace's phase 0 when it has none)."""
    phases = trace.resolve(config.bandwidth_bps)
    if config.bandwidth is None:
        config = dataclasses.replace(config, bandwidth=rate_text(phases[0]["rate_bps"]))
    return config, phases


def _check_trace_args(args: argparse.Namespace) -> BandwidthTrace | None:
    if not args.bandwidth_trace:
        return None
    if args.rounds is not None:
        raise CaramelError(f"--rounds {args.rounds} with --bandwidth-trace: the rounds run until the trace's last phase "
                           "ends; set the phases' duration_s instead")
    if args.network == "loopback":
        raise CaramelError("--bandwidth-trace changes the emulated cluster's links; it cannot run with --network loopback")
    return load_trace(args.bandwidth_trace)


# the options of the strategies bench that mean nothing to `--data` (dest, flag, its unset value)
_NOT_WITH_DATA = (("model", "--model", None), ("ratio", "--ratio", None), ("bandwidth", "--bandwidth", None),
                  ("slow_worker", "--slow-worker", None), ("slow_link", "--slow-link", None), ("jitter", "--jitter", None),
                  ("model_option", "--model-option", []), ("bandwidth_trace", "--bandwidth-trace", None),
                  ("quick", "--quick", False), ("strategies", "--strategies", None),
                  ("steps", "--steps", None), ("warmup", "--warmup", None), ("screen_rounds", "--screen-rounds", None),
                  ("mtu", "--mtu", "auto"), ("trace", "--trace", None), ("nproc_per_node", "--nproc-per-node", None))  # --network: loopback or cluster store


def _refuse_strategy_flags(args: argparse.Namespace) -> None:
    """A strategies-bench flag given with --data is an error, not silently ignored."""
    for dest, flag, unset in _NOT_WITH_DATA:
        if getattr(args, dest, unset) != unset:
            raise CaramelError(f"{flag} has no meaning with --data: --data runs the data-loading bench (the plain "
                               "loader vs caramel.data), which takes --workers, --batch-size, --rounds, --timeout, "
                               "--network, --json, --markdown and the data-loading options")


def _refuse_data_flags(args: argparse.Namespace) -> None:
    """A data-loading flag given without --data is an error, not silently ignored."""
    from caramel.bench.data_cli import add_loading_arguments

    loading = argparse.ArgumentParser(add_help=False)
    add_loading_arguments(loading, modes_flag="--data-modes", epochs_flag="--data-epochs")
    for action in loading._actions:
        if getattr(args, action.dest, action.default) != action.default:
            raise CaramelError(f"{action.option_strings[0]} is a data-loading option: it needs --data URL (the "
                               "data-loading bench); the strategies bench does not read it")


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise CaramelError(f"--timeout must be positive, got {args.timeout}")
    if args.data:
        from caramel.bench.data_cli import run_bench_data

        _refuse_strategy_flags(args)
        return run_bench_data(args)
    _refuse_data_flags(args)
    strategies = parse_strategies(strategies_text(args))
    trace = _check_trace_args(args)
    configs, settings = select(args)
    if trace is not None:  # absolute-only traces build their links at phase 0's rate; relative ones need a base
        configs = [c if c.needs_rate else _trace_phases(trace, c)[0] for c in configs]
    from caramel.cluster.config import parse_mtu

    parse_mtu(args.mtu, 1e9)  # a bad --mtu stops here, before any cluster is made
    for config in configs:
        # a network the configuration cannot run on stops here, and so does a slow link without one
        if _network_for(args, config) != "cluster" and config.nproc_per_node > 1:
            raise CaramelError(f"--nproc-per-node {config.nproc_per_node}: several ranks per host need the emulated "
                               "cluster (root, --network auto or cluster)")
        if _network_for(args, config) != "cluster" and config.slow_link:
            raise CaramelError(f"--slow-link {args.slow_link}: needs the emulated cluster and a link rate (--ratio or "
                               "--bandwidth); on loopback there is no link to slow")
    load_start = os.getloadavg()[0]
    records: list[Record] = []
    versus: list[dict[str, Any]] = []
    inputs: dict[str, Any] = {}  # per configuration: what a replay of its predictions needs
    networks: set[str] = set()
    t0 = time.time()
    configs, failures = derive_rates(configs, _calibration_launcher(args, settings))
    by_phase: list[dict[str, Any]] = []
    for i, config in enumerate(configs):
        network = _network_for(args, config)
        trace_dir = _trace_subdir(args.trace, i, config) if args.trace else None
        print(f"caramel bench: [{i + 1}/{len(configs)}] {config.label} ({network})", file=sys.stderr, flush=True)
        job = make_job(config, settings, strategies, network, trace_dir)
        phases = _trace_phases(trace, config)[1] if trace is not None else None
        result = launch_job(job, config.hosts, rate_text(phases[0]["rate_bps"]) if phases else config.bandwidth, network,
                            timeout_s=args.timeout + (trace.total_s if trace is not None else 0.0),
                            strict=args.network == "cluster", mtu=args.mtu, slow_link=config.slow_link, trace=phases,
                            nproc_per_node=config.nproc_per_node)
        networks.add(result.network)
        if config.bandwidth is not None and result.network == LOOPBACK:
            print(f"caramel bench: {config.label} ran on unshaped loopback; the bandwidth {config.bandwidth} was NOT applied",
                  file=sys.stderr)
        if result.raw is None:
            failures.append(f"{config.label}: job failed with exit code {result.returncode}")
            print(f"caramel bench: {failures[-1]}", file=sys.stderr)
            continue
        attach_evidence(result.raw, trace_dir)
        job_records = summarize(result.raw)
        records += job_records
        if result.raw.get("prediction_inputs") and job_records:
            # keyed as the records group (`config_label`): a record finds its profile by its own label
            inputs[config_label(job_records[0])] = result.raw["prediction_inputs"]
        versus += [dict(v, config=config.label) for v in versus_best_allreduce(result.raw)]
        if phases is not None:
            result.raw["bandwidth_trace"]["applied"] = result.trace_applied or []
            replans = {n: st.get("replans") for n, st in result.raw.get("stats", {}).items() if st.get("replans") is not None}
            by_phase.append({"config": config.label, "trace": args.bandwidth_trace, "phases": phase_results(result.raw),
                             "replans": replans})
    wall_s = time.time() - t0

    if records:
        print(format_table(records))
        uneven = format_uneven(records)
        if uneven:
            print(uneven)
        print()
        print("The simulator against the measurement:\n" + format_predictions(records).replace("`", ""))
        print()
        tuned = format_tuning(records)
        if tuned:
            print("Tuned references (screened in the job before the rounds):\n" + tuned.replace("`", "").replace("**", ""))
            print()
        print("Summary (against each configuration's stronger DDP variant):\n"
              + format_summary(summarize_strategies(records)).replace("`", ""))
    if versus:
        print("\n" + format_versus(versus))
    for entry in by_phase:
        print("\n" + format_phases(entry["phases"], f"Bandwidth trace {entry['trace']}, {entry['config']}:").replace("`", ""))
    code = code_version()
    meta = {"command": command_line(args), "code": code, "wall_s": round(wall_s, 1), "networks": sorted(networks),
            "settings": vars(settings), "failures": failures}
    if versus:
        meta["gossip_vs_best_allreduce"] = versus
    uneven = {c.label: {"slow_link": c.slow_link, "jitter": c.jitter} for c in configs if c.slow_link or c.jitter}
    if uneven:
        meta["heterogeneity"] = uneven
    if inputs:  # a replay of the predictions needs the profile too (`caramel.bench.hetero_prediction`)
        meta["prediction_inputs"] = inputs
    if by_phase:
        meta["bandwidth_trace"] = by_phase
    if args.json:
        write_records(args.json, records, meta)
    if args.markdown:
        env = _environment(settings, networks, wall_s, load_start)
        env["code"] = code
        if uneven:
            env["heterogeneity"] = "; ".join(f"{k}: {describe(v)}" for k, v in uneven.items())
        notes = "\n".join([f"- FAILED: {f}" for f in failures] + [f"- {line}" for line in format_uneven(records).splitlines()]
                          + [f"- {line}" for line in format_versus(versus).splitlines()]
                          + [format_phases(e["phases"], f"\nBandwidth trace {e['trace']}, {e['config']}:") for e in by_phase])
        atomic_write_text(args.markdown, format_markdown(records, command_line(args), env, notes))
    if failures:
        print("caramel bench: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


def _environment(settings: BenchSettings, networks: set[str], wall_s: float, load_start: float) -> dict[str, Any]:
    import platform

    import torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "host": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}",
        "torch": torch.__version__,
        "network": ", ".join(sorted(networks)) or "-",
        "workers": "one process per worker, 1 compute thread each (OMP_NUM_THREADS=1)",
        "measurement": (f"{settings.rounds} rounds x {settings.steps_per_round} measured steps per strategy "
                        f"(+1 entry step per block, S + 1 under ps ssp:S, none and the drain timed under asp; "
                        f"{settings.warmup_steps} warm-up steps), SGD momentum 0.9, synthetic data"),
        "wall time": f"{wall_s:.0f} s",
        "host load": (f"1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
                      f"{os.cpu_count()} cores (other work on the host slows compute; the rates were derived from "
                      "compute measured at run start, and each row's comm/compute is measured in its own job)"),
    }
