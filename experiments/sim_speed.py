"""Speed benchmark of the simulator and the planner (the issue's targets), not a unit test.

    python -m experiments.sim_speed [--json OUT]

- planning a 200-parameter model for 8 workers with the `caramel` planner: target < 2 s (and
  the same for the inputs exactly, `input_spread=0`);
- simulating one step of a ResNet-50-sized profile on 1024 workers with a ring all-reduce
  (message-level model, trace of one representative rank): target < 5 s.
Each is timed `--repeat` times; the median is reported with the machine's load average, since
timings on a shared machine vary.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from caramel.topology.spec import ClusterSpec
from caramel.jsonio import format_tag, write_json
from caramel.strategies.planners import make_plan
from caramel.sim.simulate import simulate
from caramel.sim.synthetic import resnet50_profile, synthetic_profile


def _timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.sim_speed", description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)

    prof200 = synthetic_profile(200)
    c8 = ClusterSpec.uniform(8, 1e9)
    plan_s, plan = _timed(lambda: make_plan("caramel", prof200, c8), args.repeat)
    exact_s, exact = _timed(lambda: make_plan("caramel", prof200, c8, input_spread=0), args.repeat)

    r50 = resnet50_profile()
    c1024 = ClusterSpec.uniform(1024, 10e9, collective="ring")
    fifo = make_plan("fifo", r50, c1024)
    sim_s, res = _timed(lambda: simulate(r50, c1024, fifo, iterations=1), args.repeat)
    sim4_s, _ = _timed(lambda: simulate(r50, c1024, fifo, iterations=4), args.repeat)
    plan1024_s, plan1024 = _timed(lambda: make_plan("caramel", r50, c1024), 1)

    records = [
        {"what": "plan caramel, 200 params, 8 workers", "seconds": plan_s, "target_s": 2.0,
         "candidates": plan.options["candidates_evaluated"]},
        {"what": "the same, input_spread=0", "seconds": exact_s, "target_s": None,
         "candidates": exact.options["candidates_evaluated"]},
        {"what": "simulate 1 step, resnet50, 1024 workers, ring", "seconds": sim_s, "target_s": 5.0,
         "step_time_s": res.step_time_s},
        {"what": "simulate 4 steps, resnet50, 1024 workers, ring", "seconds": sim4_s, "target_s": None},
        {"what": "plan caramel, resnet50, 1024 workers", "seconds": plan1024_s, "target_s": None,
         "candidates": plan1024.options["candidates_evaluated"]},
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for r in records:
        target = f" (target < {r['target_s']:g} s)" if r["target_s"] else ""
        print(f"{r['what']:<48} {r['seconds']:.3f} s{target}")
    print(f"load average (1 min): {load}")
    if args.json:
        write_json(args.json, {"format": format_tag("sim_speed"), "records": records, "load_avg_1min": load,
                               "cpus": os.cpu_count()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
