"""What `branch_order="auto"` chooses on the study's models, and what the simulator predicts for it.

    python -m experiments.branch_order_planner [--json OUT]

The same profiles as `experiments.branch_order` (GoogLeNet for 32x32 inputs: nine Inception
blocks of four branches; two towers: a 4M-parameter embedding beside a conv tower), each
carrying its blocks in `meta["branches"]` as the tracer gives them. For 2 and 8 workers at
comm/compute 0.5, 1 and 2, the `caramel` planner runs with `branch_order="off"` and `"auto"`
(`compute_schedule="off"`, `input_spread=0`, as the study), and both plans are simulated on the
measured (unreordered) profile, the auto plan with its module order applied. A simulator
study, not a measurement.
"""
from __future__ import annotations

import argparse
import time

from caramel.jsonio import format_tag, write_json
from caramel.sim.simulate import simulate
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec
from experiments.branch_order import flatten, googlenet, profile_of, two_tower


def profile_with_blocks(blocks: list, compute_s: float = 0.1):
    prof = profile_of(flatten(blocks, None), compute_s)
    prof.meta["branches"] = [{"branches": [[name for name, *_ in br] for br in b], "fixed": None}
                             for b in blocks if b and isinstance(b[0], list)]
    return prof


def rows_for(name: str, blocks: list) -> list[dict]:
    prof = profile_with_blocks(blocks)
    rows = []
    for workers in (2, 8):
        for ratio in (0.5, 1.0, 2.0):
            bw = 8 * prof.total_grad_bytes() * 2 * (workers - 1) / workers / (ratio * prof.compute_time_s)
            cluster = ClusterSpec.uniform(workers, bw, 50e-6)
            common = dict(world_size=workers, compute_schedule="off", input_spread=0)
            off = make_plan("caramel", prof, cluster, **common)
            t0 = time.perf_counter()
            auto = make_plan("caramel", prof, cluster, branch_order="auto", **common)
            plan_s = time.perf_counter() - t0
            t_off = simulate(prof, cluster, off, trace=False).step_time_s
            t_auto = simulate(prof, cluster, auto, trace=False).step_time_s
            d = auto.options["branch_order"]
            rows.append({"model": name, "workers": workers, "comm_compute": ratio, "off_step_s": t_off,
                         "auto_step_s": t_auto, "gain": t_off / t_auto - 1, "reordered": auto.module_order is not None,
                         "permutations": d.get("permutations"), "identity_s": d.get("identity_s"),
                         "candidate_s": d.get("candidate_s"), "auto_plan_s": plan_s})
            print(f"{name:10s} n={workers} ratio {ratio}: off {t_off * 1e3:.2f} ms, auto {t_auto * 1e3:.2f} ms "
                  f"({rows[-1]['gain'] * 100:+.2f}%, reordered={rows[-1]['reordered']}, planned in {plan_s:.1f} s)",
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    rows = rows_for("googlenet", googlenet()) + rows_for("two_tower", two_tower())
    if args.json:
        write_json(args.json, {"format": format_tag("branch_order_planner"), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
