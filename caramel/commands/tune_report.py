"""`caramel tune --measure real`: the methods against the measured sweep, in the targets' terms.

Every method runs `--seeds` times with `--budget` measurements, each run on its own ledger
(`caramel.tune.ledger`) over the one sweep `tune_real` measured; the tuner's ledger also carries
the steps of the profile its cheap model needs. Per method it reports the real steps used, the
best measured step and its gap to the sweep's best, how many runs met the target (within 2% of
the sweep's best on at most a fifth of the sweep's real steps), and, from a second run of each
method allowed to measure every candidate, the real steps it took to first get within 2%.
"""
from __future__ import annotations

import argparse
import math
import shlex
import statistics
from typing import Any

from caramel.commands.tune_real import RealSweep, run_sweep
from caramel.jsonio import format_tag, write_json
from caramel.tune.ledger import Outcome, evaluate
from caramel.tune.objective import SimulatorObjective
from caramel.tune.space import Space

TOLERANCE = 0.02
STEP_SHARE = 0.2  # the target's share of the sweep's real steps


def run_real(args: argparse.Namespace, space: Space, methods: list[str]) -> int:
    from caramel.commands.tune import search, write_plan

    sweep = run_sweep(args, space, args.planner)
    objective = SimulatorObjective(sweep.profile, sweep.cluster, args.planner)
    cache: dict[tuple, float] = {}

    def predict(config: dict) -> float:
        key = space.key(config)
        if key not in cache:
            cache[key] = objective.predict(config)
        return cache[key]

    table, n = sweep.table, len(space.candidates())
    outcomes: dict[str, list[Outcome]] = {m: [] for m in methods}
    unbudgeted: dict[str, list[int | None]] = {m: [] for m in methods}
    trials: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for seed in range(args.seeds):
        for m in methods:
            overhead = sweep.profile_steps if m == "model" else 0
            ledger = table.ledger(overhead)
            result = search(m, space, predict, ledger.measure, args.budget, seed)
            outcomes[m].append(evaluate(m, seed, ledger, table, TOLERANCE))
            trials[m].append(result.to_dict())
            full = table.ledger(overhead)  # the same method, free to measure every candidate
            search(m, space, predict, full.measure, n, seed)
            unbudgeted[m].append(evaluate(m, seed, full, table, TOLERANCE).steps_to_reach)
    rows = [summary_row(m, outcomes[m], unbudgeted[m], table.sweep_steps) for m in methods]
    print_report(sweep, rows, predict, args)
    best_config, best = table.best
    if args.plan_out:
        write_plan(objective, best_config, args.plan_out, f"{best.step_s * 1e3:.2f} ms measured, the sweep's best")
        print(f"  as a strategy: --strategy {sweep.strategies[repr(space.key(best_config))]}")
    if args.json:
        write_json(args.json, report_json(args, sweep, space, predict, rows, outcomes, trials))
        print(f"wrote {args.json}")
    return 0


def summary_row(method: str, outcomes: list[Outcome], unbudgeted: list[int | None], sweep_steps: int) -> dict[str, Any]:
    """One method over its seeds; a run that never got within tolerance counts as infinitely many steps."""
    limit = STEP_SHARE * sweep_steps
    reach = [math.inf if s is None else s for s in unbudgeted]
    return {"method": method, "runs": len(outcomes),
            "measurements": statistics.median(o.measurements for o in outcomes),
            "steps_used": statistics.median(o.steps_used for o in outcomes),
            "steps_used_share": statistics.median(o.steps_used for o in outcomes) / sweep_steps,
            "mean_best_s": statistics.mean(o.best_s for o in outcomes),
            "mean_gap": statistics.mean(o.gap for o in outcomes), "worst_gap": max(o.gap for o in outcomes),
            "within_2pct": sum(o.gap <= TOLERANCE for o in outcomes),
            "target_met": sum(o.gap <= TOLERANCE and o.steps_used <= limit for o in outcomes),
            "median_steps_to_2pct": statistics.median(reach),
            "steps_to_2pct": [None if math.isinf(s) else s for s in reach]}


def print_report(sweep: RealSweep, rows: list[dict[str, Any]], predict, args: argparse.Namespace) -> None:
    table, space = sweep.table, sweep.table.space
    best_config, best = table.best
    ref = f"; ddp {sweep.reference_s * 1e3:.2f} ms in the same job" if sweep.reference_s else ""
    print(f"{len(table.table)} candidates measured in one interleaved job on {sweep.config.label} ({sweep.network}); "
          f"sweep best {best.step_s * 1e3:.2f} ms at {best_config}{ref}")
    print(f"the sweep cost {table.sweep_steps} real steps per worker (a fifth: {STEP_SHARE * table.sweep_steps:.0f}); "
          f"the tuner's profile {sweep.profile_steps} single-process steps, charged to it")
    width = max(len(str(c)) for c in space.candidates())
    print(f"{'candidate':{width}}  {'predicted ms':>12}  {'measured ms':>11}  {'steps':>5}")
    for c in sorted(space.candidates(), key=lambda c: table.table[space.key(c)].step_s):
        m = table.table[space.key(c)]
        print(f"{str(c):{width}}  {predict(c) * 1e3:12.2f}  {m.step_s * 1e3:11.2f}  {m.steps:5d}")
    print(f"\nbudget {args.budget} measurements per run, {args.seeds} seeds; target: within {TOLERANCE:.0%} of the "
          f"sweep's best on at most {STEP_SHARE:.0%} of its real steps")
    print(f"{'method':8}  {'steps used':>10}  {'of sweep':>8}  {'mean best ms':>12}  {'mean gap':>8}  {'within 2%':>9}  "
          f"{'target met':>10}  {'median steps to 2%':>18}")
    for r in rows:
        to = "never" if math.isinf(r["median_steps_to_2pct"]) else f"{r['median_steps_to_2pct']:g}"
        print(f"{r['method']:8}  {r['steps_used']:10g}  {r['steps_used_share']:8.0%}  {r['mean_best_s'] * 1e3:12.2f}  "
              f"{r['mean_gap']:8.1%}  {r['within_2pct']:>4}/{r['runs']:<4}  {r['target_met']:>5}/{r['runs']:<4}  {to:>18}")
    print("(steps to 2%: each method run again free to measure every candidate; the real steps until it first "
          "measured one within 2%)")


def command_line(args: argparse.Namespace) -> str:
    """The `caramel tune` command that reproduces this run (into the JSON report)."""
    parts = ["caramel", "tune", "--measure", "real", "--network", args.network]
    for flag in ("ratio", "bandwidth", "workers", "model", "batch_size", "planner", "methods", "budget", "seeds",
                 "rounds", "steps", "warmup"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", f"{value:g}" if isinstance(value, float) else str(value)]
    for flag, items in (("--model-option", args.model_option), ("--knob", args.knob)):
        for item in items:
            parts += [flag, item]
    return " ".join(shlex.quote(p) for p in parts)


def report_json(args: argparse.Namespace, sweep: RealSweep, space: Space, predict, rows, outcomes, trials) -> dict:
    table = sweep.table
    return {
        "format": format_tag("tune"), "measure": "real", "command": command_line(args), "planner": args.planner, "budget": args.budget,
        "seeds": args.seeds, "tolerance": TOLERANCE, "step_share": STEP_SHARE,
        "space": [{"name": k.name, "choices": list(k.choices), "log": k.log} for k in space.knobs],
        "bench": {"config": sweep.config.to_dict(), "network": sweep.network, "rounds": args.rounds,
                  "steps_per_round": args.steps, "warmup_steps": args.warmup, "reference_ddp_s": sweep.reference_s,
                  "records": sweep.records},
        "profile_steps": sweep.profile_steps, "sweep_steps": table.sweep_steps,
        "sweep": [{"config": c, "strategy": sweep.strategies[repr(space.key(c))],
                   "measured_s": table.table[space.key(c)].step_s, "steps": table.table[space.key(c)].steps,
                   "predicted_s": predict(c)} for c in space.candidates()],
        "rows": [dict(r, median_steps_to_2pct=None if math.isinf(r["median_steps_to_2pct"]) else r["median_steps_to_2pct"])
                 for r in rows],
        "outcomes": {m: [o.to_dict() for o in os_] for m, os_ in outcomes.items()},
        "runs": trials,
    }
