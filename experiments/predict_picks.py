"""What a tree's models pick and predict for given strategies on a bench run's saved inputs.

`experiments/predict_saved_inputs.py` prints each recorded strategy's step; this prints, for
the strategies named (a chooser such as `pipeline:replicas=auto,stages=auto`, or an explicit
layout to compare with its pick), the predicted step (and on the rate-only link), and the
plan picked where the tree reports one, from the first configuration's
`trace/*/prediction_inputs.json`, and the seconds the predictions took. Run it from two trees
(PYTHONPATH) to see how a chooser's pick moved.

    PYTHONPATH=. python experiments/predict_picks.py docs/results/pipeline_profile_turns/run_r \\
        pipeline:replicas=auto,stages=auto pipeline:microbatches=2,partition=layer3,replicas=2,stages=2
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: predict_picks.py RUN_DIR STRATEGY...", file=sys.stderr)
        return 2
    from caramel.bench.hetero_prediction import Heterogeneity
    from caramel.bench.prediction import job_predictions
    from caramel.profile.model_profile import ModelProfile

    run, names = argv[0], argv[1:]
    paths = sorted(glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json")))
    if not paths:
        print(f"predict_picks: {run}: expected trace/*/prediction_inputs.json (caramel bench --trace DIR)",
              file=sys.stderr)
        return 2
    with open(paths[0]) as f:
        d = json.load(f)
    t = time.perf_counter()
    out = job_predictions(ModelProfile.from_dict(d["profile"]), names, d["world"], d["grad_bytes"], d["comm_s"],
                          d["comm_buckets"], d["rank_compute_s"], d["spans"], d["probed"], d.get("traffic"),
                          Heterogeneity.from_dict(d.get("heterogeneity")), layout=d.get("layout"))
    seconds = time.perf_counter() - t
    for name in names:
        p, rate_only = out["predicted"].get(name) or {}, (out.get("predicted_rate_only") or {}).get(name) or {}
        step, step_rate = p.get("step_time_s"), rate_only.get("step_time_s")
        print(f"{name}: {1e3 * step:.1f} ms" if step else f"{name}: not predicted ({p.get('error')})",
              f"(rate-only link {1e3 * step_rate:.1f} ms)" if step_rate else "", f"plan {p.get('plan')}")
    print(f"predictions took {seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
