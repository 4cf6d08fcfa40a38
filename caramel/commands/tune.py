"""`caramel tune`: search plan knobs for a model and cluster; the tuner next to random search and
Optuna's TPE at the same budget of measurements, against an exhaustive sweep.

    caramel tune --synthetic resnet50 --workers 8 --bandwidth 1gbit --planner fifo \\
        --knob bucket_cap_mb=log:1|2|5|10|25|50|100 --knob first_bucket_mb=log:0.25|1|4 \\
        --knob overlap=forward|backward --budget 8 --seeds 5 --plan-out best.plan.json --json tune.json

    caramel tune --measure real --ratio 1 --network cluster --knob bucket_cap_mb=log:0.25|0.5|1|2 \\
        --knob first_bucket_mb=log:0.25|1 --knob overlap=forward|backward --budget 3 --seeds 10

`--measure simulated` (the default) measures with the simulator's detailed model; `--measure
real` measures every candidate as real training steps of the caramel strategy in one bench job
and charges each method the real steps of the candidates it asks for (`tune_real`,
docs/tune.md). Every method's trials are in the report (caramel.tune/1), and the best
configuration's plan is written as a file `parallelize(plan=...)` loads.
"""
from __future__ import annotations

import argparse

from caramel.commands.common import SYNTHETIC_HELP, add_cluster_arguments, cluster_from_args, load_profile
from caramel.commands.tune_real import add_real_arguments
from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json
from caramel.tune.objective import SimulatorObjective
from caramel.tune.search import SearchResult, model_guided, random_search, tpe_search
from caramel.tune.space import Space, parse_space

METHODS = ("model", "random", "tpe")
MEASURES = ("simulated", "real")
DEFAULT_KNOBS = ["bucket_cap_mb=log:1|2|5|10|25|50|100", "first_bucket_mb=log:0.25|1|4", "overlap=forward|backward"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--profile", metavar="P.json", help="--measure simulated: a ModelProfile file")
    src.add_argument("--synthetic", metavar="NAME", help=f"--measure simulated: a built-in profile, {SYNTHETIC_HELP}")
    add_cluster_arguments(parser)
    parser.add_argument("--measure", choices=MEASURES, default="simulated",
                        help="simulated: the simulator's detailed model (default); real: real training steps of "
                             "every candidate in one bench job, charged to each method per candidate it asks for")
    parser.add_argument("--planner", default="fifo", help="the planner whose knobs are searched (default fifo)")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=a|b|c",
                        help=f"a knob and its choices (repeatable; default {' '.join(DEFAULT_KNOBS)})")
    parser.add_argument("--budget", type=int, default=8, help="measurements per method per seed (default 8)")
    parser.add_argument("--seeds", type=int, default=5, help="independent runs of each method (default 5)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated among {', '.join(METHODS)}")
    parser.add_argument("--compute-slowdown", type=float, default=1.2,
                        help="--measure simulated: CPU contention in the measurement model (default 1.2)")
    parser.add_argument("--plan-out", metavar="PLAN.json", help="write the best measured configuration's plan")
    parser.add_argument("--json", metavar="OUT", help="write every trial and the sweep (caramel.tune/1)")
    add_real_arguments(parser)


def search(method: str, space: Space, predict, measure, budget: int, seed: int) -> SearchResult:
    if method == "model":
        return model_guided(space, predict, measure, budget, seed=seed)
    if method == "random":
        return random_search(space, measure, budget, seed=seed)
    return tpe_search(space, measure, budget, seed=seed)


def run(args: argparse.Namespace) -> int:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            raise CaramelError(f"--methods: {m!r} is not a method; expected among {', '.join(METHODS)}")
    if args.budget < 1 or args.seeds < 1:
        raise CaramelError("--budget and --seeds must be positive")
    space = parse_space(args.knob or DEFAULT_KNOBS)
    if args.measure == "real":
        if args.profile or args.synthetic:
            raise CaramelError("--measure real profiles the --model it runs; --profile and --synthetic are for "
                               "--measure simulated")
        ignored = [f"--{f.replace('_', '-')}" for f in ("cluster", "latency", "queued_latency", "collective_cpu",
                                                          "collective", "topology", "servers")
                   if getattr(args, f, None) is not None]
        if ignored:
            raise CaramelError(f"--measure real runs on the emulated cluster or loopback of --workers and --bandwidth/"
                               f"--ratio; {', '.join(ignored)} describe(s) a simulated cluster")
        from caramel.commands.tune_report import run_real

        return run_real(args, space, methods)
    if not (args.profile or args.synthetic):
        raise CaramelError("--measure simulated needs a model: --profile P.json or --synthetic NAME")
    real_only = [f"--{f.replace('_', '-')}" for f in ("model", "ratio", "batch_size") if getattr(args, f) is not None]
    if real_only or args.model_option:
        raise CaramelError(f"{', '.join(real_only + ['--model-option'] * bool(args.model_option))}: for --measure real "
                           "only; --measure simulated takes the model from --profile or --synthetic")
    return _run_simulated(args, space, methods)


def _run_simulated(args: argparse.Namespace, space: Space, methods: list[str]) -> int:
    import statistics

    objective = SimulatorObjective(load_profile(args), cluster_from_args(args), args.planner, args.compute_slowdown)
    candidates = space.candidates()
    sweep = [(c, objective.measure(c)) for c in candidates]  # the exhaustive reference
    best_config, best_s = min(sweep, key=lambda x: x[1])
    target = best_s * 1.02
    runs = {m: [search(m, space, objective.predict, objective.measure, args.budget, seed) for seed in range(args.seeds)]
            for m in methods}
    print(f"{len(candidates)} candidates; exhaustive sweep best {best_s * 1e3:.2f} ms at {best_config}; "
          f"budget {args.budget} measurements ({args.budget / len(candidates):.0%} of the sweep), {args.seeds} seeds "
          "(measured by the simulator's detailed model, not real steps)")
    print(f"{'method':8}  {'mean best ms':>12}  {'within 2%':>9}  {'median trials to 2%':>19}")
    rows = []
    for m, results in runs.items():
        bests = [r.best.measured_s for r in results]
        reach = [r.trials_to_reach(target) for r in results]
        hit = [n for n in reach if n is not None]
        rows.append({"method": m, "mean_best_s": statistics.mean(bests), "within_2pct": len(hit), "runs": len(results),
                     "trials_to_2pct": reach})
        med = f"{statistics.median(hit):g}" if hit else "-"
        print(f"{m:8}  {statistics.mean(bests) * 1e3:12.2f}  {len(hit):>4}/{len(results):<4}  {med:>19}")
    overall = min((r.best for rs in runs.values() for r in rs), key=lambda t: t.measured_s)
    if args.plan_out:
        write_plan(objective, overall.config, args.plan_out, f"{overall.measured_s * 1e3:.2f} ms")
    if args.json:
        write_json(args.json, {"format": format_tag("tune"), "measure": "simulated", "planner": args.planner,
                               "budget": args.budget,
                               "space": [{"name": k.name, "choices": list(k.choices), "log": k.log} for k in space.knobs],
                               "sweep": [{"config": c, "measured_s": s} for c, s in sweep], "rows": rows,
                               "runs": {m: [r.to_dict() for r in rs] for m, rs in runs.items()}})
        print(f"wrote {args.json}")
    return 0


def write_plan(objective: SimulatorObjective, config: dict, path: str, what: str) -> None:
    plan, overlap = objective.plan(config)
    plan.save(path)
    print(f"wrote {path} ({config}, {what}; run it with overlap={overlap})")
