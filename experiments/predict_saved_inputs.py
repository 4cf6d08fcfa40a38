"""Every strategy's prediction again from a bench run's saved inputs, with this tree's models.

`caramel bench --trace DIR` keeps, per configuration, what its predictions were made from
(`prediction_inputs.json`: the profile, each rank's compute-only median, the concurrent
baseline's spans, the link probe). This predicts each strategy of the run's `bench.json` from
them (`caramel.bench.prediction.job_predictions`, as the bench does) and prints it beside the
recorded prediction and the measured median. Run it from two trees (PYTHONPATH) to see which
rows a model change moves: data parallelism's must not move when only the pipeline's does.

    PYTHONPATH=. python experiments/predict_saved_inputs.py docs/results/pipeline_profile_turns/run_m
"""
from __future__ import annotations

import glob
import json
import os
import sys


def predict_run(run: str) -> list[dict]:
    from caramel.bench.hetero_prediction import Heterogeneity
    from caramel.bench.prediction import job_predictions
    from caramel.profile.model_profile import ModelProfile

    bench = json.load(open(os.path.join(run, "bench.json")))
    rows = []
    for path in sorted(glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json"))):
        d = json.load(open(path))
        records = [r for r in bench["records"] if r.get("predicted_step_s") is not None or r.get("step_time_median_s")]
        names = [r["strategy"] for r in records]
        out = job_predictions(ModelProfile.from_dict(d["profile"]), names, d["world"], d["grad_bytes"], d["comm_s"],
                              d["comm_buckets"], d["rank_compute_s"], d["spans"], d["probed"],
                              hetero=Heterogeneity.from_dict(d.get("heterogeneity")))["predicted"]
        for r in records:
            p = out.get(r["strategy"], {}).get("step_time_s")
            rows.append({"run": run, "strategy": r["strategy"], "measured_s": r.get("step_time_median_s"),
                         "recorded_s": r.get("predicted_step_s"), "predicted_s": p})
    return rows


def main(argv: list[str]) -> int:
    for run in argv:
        for r in predict_run(run):
            m, rec, p = r["measured_s"], r["recorded_s"], r["predicted_s"]
            err = f"{100 * (p / m - 1):+.1f}%" if p and m else "-"
            print(f"{run}: {r['strategy']}: measured {1e3 * (m or 0):.1f} ms, recorded {1e3 * (rec or 0):.1f}, "
                  f"this tree {1e3 * (p or 0):.1f} ({err})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
