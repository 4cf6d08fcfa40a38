"""Repredict a data-bench record's step times with the current model from the inputs it recorded.

`caramel bench --data ... --json FILE` records each mode's measured tier counts, hit rates and
calibrations (the one before the modes, and one right before each mode's round). This reads a
record, rebuilds each mode's model with `caramel.bench.data_report.predict` and each round's
contention with `round_inputs` (against the run's floor of steps alone), and prints the measured step, the prediction of
the model with each round's own calibration (the median over rounds), and the recorded
predictions, so records taken before a model change can be scored by the changed model without
measuring anything again. Usage: python -m experiments.data_model_repredict STORE_DIR FILE...
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from caramel.bench.data_bench import DataBenchConfig
from caramel.bench.data_contention import alone_floor_s, round_inputs
from caramel.bench.data_report import batch_trip_s, measured_contention, predict
from caramel.data.store import Store
from caramel.stats import median


def repredict(record: dict, index) -> list[dict]:
    cfg_dict = dict(record["config"], modes=tuple(record["config"]["modes"]))
    cfg = DataBenchConfig(**cfg_dict)
    costs = record["measured_costs"]
    single = measured_contention(cfg, index, costs)
    start = costs["compute_comm_s"] if costs.get("compute_comm_s") is not None else cfg.compute_s
    floor = alone_floor_s(costs.get("compute_comm_s"), [c for row in record["rows"] for c in row.get("calibrations", [])])
    out = []
    for row in record["rows"]:
        sample_hit = min(max(row["sample_hit_rate_steady"], 0.0), 1.0)
        model = predict(cfg, row["mode"], index, costs, sample_hit, min(row["memory_share_steady"], sample_hit),
                        row["samples_per_disk_read"], row["fetch_amplification"], single, row["hit_rate_steady"])
        rounds = round_inputs(row.get("calibrations", []), batch_trip_s(cfg, row["mode"], index, costs),
                              floor if floor else cfg.compute_s)
        per_round = [replace(model, contention=c).step_time_s(a) for c, a in rounds]
        now = median(per_round) if per_round else model.step_time_s(start)
        out.append({"mode": row["mode"], "measured_s": row["step_s_steady"], "repredicted_s": now,
                    "error": now / row["step_s_steady"] - 1, "recorded_error": row["prediction_error"],
                    "one_calibration_error": model.step_time_s(start) / row["step_s_steady"] - 1,
                    "before_error": row["prediction_error_before"]})
    return out


def main(argv: list[str]) -> int:
    index = Store(argv[0]).index()
    for path in argv[1:]:
        with open(path) as f:
            record = json.load(f)
        for r in repredict(record, index):
            print(f"{path}  {r['mode']:<9} measured {r['measured_s'] * 1e3:6.2f} ms  repredicted "
                  f"{r['repredicted_s'] * 1e3:6.2f} ms ({r['error']:+.0%})  recorded {r['recorded_error']:+.0%}  "
                  f"one calibration {r['one_calibration_error']:+.0%}  before {r['before_error']:+.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
