"""A bench run's predictions again, from the model of another commit: before/after a model change.

The bench predicts each strategy from a profile taken on its workers, each rank's compute-only
step and the probed link (`caramel.bench.prediction`); its JSON keeps all of that but the
profile. This profiles the configuration's model here, replays it at the pace the bench
recorded (`worker_speeds` from the record's compute-only step) on the record's link, and
predicts each strategy with this tree's simulator and with the simulate.py files of `--ref`,
so one measured run scores both models. The prediction of this tree is printed beside the one
the bench recorded, which checks the replay (the same model gives the same number).

    python experiments/predict_again.py docs/results/gossip-ps-gap.json --ref 35d77f2 \\
        --modules gossip,ps --json docs/results/gossip-ps-gap-predictions.json
"""
from __future__ import annotations

import argparse
import json
import linecache
import subprocess
import sys
import types
from pathlib import Path

import torch

from caramel.jsonio import write_json

SIMULATE = {"gossip": ("caramel/strategies/gossip/simulate.py", "simulate_gossip"),
            "ps": ("caramel/strategies/ps/simulate.py", "simulate_ps")}


def old_simulator(ref: str, kind: str):
    """`kind`'s simulate function as it was at git `ref`, loaded beside this tree's modules. No
    file is written: the source is compiled under a name that says where it came from and given
    to linecache, so tracebacks and `inspect.getsource` show its lines."""
    path, fn = SIMULATE[kind]
    src = subprocess.run(["git", "show", f"{ref}:{path}"], check=True, capture_output=True, text=True).stdout
    filename = f"<git {ref}:{path}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    mod = types.ModuleType(f"old_{kind}_simulate")
    mod.__file__ = filename
    sys.modules[mod.__name__] = mod  # dataclasses look their module up while the source runs
    exec(compile(src, filename, "exec"), mod.__dict__)
    return getattr(mod, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json")
    ap.add_argument("--ref", required=True, help="git commit whose simulate.py files give the 'before' model")
    ap.add_argument("--modules", default="gossip,ps")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from caramel.bench.harness import make_workload
    from caramel.bench.lower_bound import profile_workload
    from caramel.bench.matrix import BenchConfig
    from caramel.bench.prediction import bench_cluster, prediction_error, worker_speeds
    from caramel.strategies import STRATEGIES

    data = json.loads(Path(args.bench_json).read_text())
    kinds = args.modules.split(",")
    olds = {k: old_simulator(args.ref, k) for k in kinds}
    profiles: dict = {}
    rows = []
    for r in data["records"]:
        spec = STRATEGIES.spec(r["strategy"])
        if spec.info.name not in kinds or r.get("step_time_median_s") is None:
            continue
        key = (r["model"], json.dumps(r.get("model_options") or {}, sort_keys=True), r["batch_size"])
        if key not in profiles:
            cfg = BenchConfig(model=r["model"], workers=r["workers"], model_options=dict(r.get("model_options") or {}),
                              batch_size=r["batch_size"])
            profiles[key] = profile_workload(make_workload(cfg, 0, torch.device("cpu")))
        profile = profiles[key]
        link = r["link_fit"]
        speeds = worker_speeds(profile.step_time_s, [r["compute_s"]] * r["workers"])
        cluster = bench_cluster(r["workers"], link["net_bandwidth_bps"], speeds, link,
                                r.get("compute_slowdown") or 1.0)  # the contention the bench measured, if any
        now = spec.simulate(profile, cluster).step_time_s
        before = olds[spec.info.name](profile, cluster, spec.options).step_time_s
        m = r["step_time_median_s"]
        rows.append({"config": f"{r['model']} x{r['workers']} @ {r['bandwidth']}", "strategy": r["strategy"],
                     "measured_s": m, "bench_predicted_s": r["predicted_step_s"],
                     "replayed_now_s": now, "replayed_before_s": before,
                     "error_now": prediction_error(now, m), "error_before": prediction_error(before, m)})
    for x in rows:
        print(f"{x['config']:40s} {x['strategy']:24s} measured {1e3 * x['measured_s']:6.1f} ms  bench predicted "
              f"{1e3 * (x['bench_predicted_s'] or 0):6.1f}  replayed now {1e3 * x['replayed_now_s']:6.1f} "
              f"({100 * x['error_now']:+.0f}%)  before {1e3 * x['replayed_before_s']:6.1f} ({100 * x['error_before']:+.0f}%)")
    if args.json:
        write_json(args.json, {"format": "caramel.predict-again/1", "bench_json": args.bench_json, "ref": args.ref,
                               "command": " ".join(sys.argv), "rows": rows})


if __name__ == "__main__":
    main()
