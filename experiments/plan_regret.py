"""How much a plan made from one measurement loses under another: for each configuration of a
traced bench run (`caramel bench --trace DIR`), every engine instance's saved plan inputs
(`*.rank0.profile.json`, `*.rank0.cluster.json`) are planned from, and each plan is simulated
under every other instance's inputs. The regret of a plan under some inputs is its simulated
step time over the best of all plans made here for those inputs, less 1. Printed per
configuration and overlap mode, for each `input_spread` asked for.

    python experiments/plan_regret.py runs/bench-trace --spreads 0,0.25
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

SUFFIX = ".rank0.profile.json"


def _inputs(config: Path):
    from caramel.topology.spec import ClusterSpec
    from caramel.profile.model_profile import ModelProfile

    names = sorted(p.name[:-len(SUFFIX)] for p in config.iterdir() if p.name.endswith(SUFFIX))
    return [(ModelProfile.load(config / f"{n}{SUFFIX}"), ClusterSpec.load(config / f"{n}.rank0.cluster.json")) for n in names]


def regrets(trace_dir: Path, spreads: list[float], overlaps: list[str], out=print) -> dict[float, list[float]]:
    """Every (plan, other instance's inputs) regret per `input_spread`, over every configuration
    folder of `trace_dir` with at least two instances; one line per configuration and overlap to `out`."""
    from caramel.strategies.planners import make_plan
    from caramel.sim.simulate import simulate

    configs = sorted(d for d in trace_dir.iterdir() if d.is_dir() and any(d.glob(f"*{SUFFIX}")))
    if not configs:
        raise ValueError(f"{trace_dir}: no configuration folder holds saved plan inputs (*{SUFFIX})")
    found: dict[float, list[float]] = {s: [] for s in spreads}
    for config in configs:
        inputs = _inputs(config)
        if len(inputs) < 2:
            continue
        for overlap in overlaps:
            plans = {s: [make_plan("caramel", p, c, world_size=c.world_size, overlap=overlap, input_spread=s)
                         for p, c in inputs] for s in spreads}
            step = {s: [[simulate(p, c, plan, overlap=overlap, trace=False).step_time_s for p, c in inputs]
                        for plan in plans[s]] for s in spreads}
            best = [min(step[s][i][j] for s in spreads for i in range(len(inputs))) for j in range(len(inputs))]
            line = f"{config.name:28s} {overlap:8s}"
            for s in spreads:
                r = [step[s][i][j] / best[j] - 1 for i in range(len(inputs)) for j in range(len(inputs)) if i != j]
                found[s] += r
                line += (f" | spread {s:g}: buckets {','.join(str(len(p.buckets)) for p in plans[s])}, "
                         f"regret mean {100 * statistics.fmean(r):4.1f}% max {100 * max(r):4.1f}%")
            out(line)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir", type=Path, help="a `caramel bench --trace` directory (one folder per configuration)")
    parser.add_argument("--spreads", default="0,0.25", help="input_spread values to compare (default 0,0.25)")
    parser.add_argument("--overlaps", default="backward,forward")
    args = parser.parse_args(argv)
    try:
        found = regrets(args.trace_dir, [float(s) for s in args.spreads.split(",")], args.overlaps.split(","))
    except (ValueError, OSError) as e:
        parser.error(str(e))
    for s, r in found.items():
        if r:
            print(f"input_spread {s:g}: mean regret {100 * statistics.fmean(r):.2f}%, "
                  f"max {100 * max(r):.1f}% over {len(r)} (plan, other inputs) pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
