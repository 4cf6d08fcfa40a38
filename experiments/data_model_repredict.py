"""Repredict a data-bench record's step times with the current model from the inputs it recorded.

`caramel bench --data ... --json FILE` records each mode's measured tier counts, hit rates and
calibrations (the one before the modes, and one right before each mode's round). This reads a
record, rebuilds each mode's model with `caramel.bench.data_report.predict` and each round's
contention with `round_inputs` (against the run's floor of steps alone), and prints the measured step, the prediction of
the model with each round's own calibration (the median over rounds; from a
`caramel.data-bench/4` or later record, with each round's read time under load too, and where
a calibration timed it, each round's restart of the warm workers), and the recorded
predictions, so records taken before a model change can be scored by the changed model without
measuring anything again; with the epoch edge the model charges once per epoch (median over
rounds). A FILE is a record or a results file of runs
(`caramel.data-bench-runs/1`, as in docs/results), whose every record is rescored; a field an
older record lacks prints as "-". Usage: python -m experiments.data_model_repredict STORE_DIR FILE...
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from statistics import correlation
from typing import Any

from caramel.bench.data_bench import DataBenchConfig
from caramel.bench.data_contention import alone_floor_s, round_inputs
from caramel.bench.data_report import batch_trip_s, measured_contention, predict, round_models, stored_records_of
from caramel.data.store import Store
from caramel.errors import CaramelError
from caramel.stats import median


# what the model is rebuilt from: a record without them (caramel.data-bench/1) cannot be rescored
ROW_INPUTS = ("step_s_steady", "sample_hit_rate_steady", "memory_share_steady", "samples_per_disk_read",
              "fetch_amplification", "hit_rate_steady")


def missing_inputs(record: dict) -> list[str]:
    """The model's inputs that some row of `record` lacks."""
    return sorted({k for row in record["rows"] for k in ROW_INPUTS if k not in row})


def row_models(record: dict, index, row: dict, read_spreads: bool = False) -> tuple[Any, list[tuple[Any, float]], float]:
    """(the model with one calibration per run, each round's model with its compute + all-reduce
    alone in the calibrations' order, that one model's compute + all-reduce) of `row` of `record`:
    what `repredict` scores, for scripts that read a round's model by its round; `read_spreads`:
    the link queue scaled by the kept reads' spread, `round_models`)."""
    cfg = DataBenchConfig(**dict(record["config"], modes=tuple(record["config"]["modes"])))
    costs = record["measured_costs"]
    single = measured_contention(cfg, index, costs)
    start = costs["compute_comm_s"] if costs.get("compute_comm_s") is not None else cfg.compute_s
    floor = alone_floor_s(costs.get("compute_comm_s"), [c for r in record["rows"] for c in r.get("calibrations", [])])
    sample_hit = min(max(row["sample_hit_rate_steady"], 0.0), 1.0)
    model = predict(cfg, row["mode"], index, costs, sample_hit, min(row["memory_share_steady"], sample_hit),
                    row["samples_per_disk_read"], row["fetch_amplification"], single, row["hit_rate_steady"],
                    cpu_count=record.get("cpu_count"))  # the recording host's cores, not this one's
    rounds = round_inputs(row.get("calibrations", []), batch_trip_s(cfg, row["mode"], index, costs),
                          floor if floor else cfg.compute_s)
    # the bench's own charge of each round (range reads only, as in caramel.data-bench/5: /4 records
    # charged every mode, so their non-plain rows move; the restart 0 in records before it was timed)
    return model, round_models(model, row.get("calibrations", []), rounds, read_spreads), start


def repredict(record: dict, index) -> list[dict]:
    out = []
    for row in record["rows"]:
        model, models, start = row_models(record, index, row)
        now = median(m.step_time_s(a) for m, a in models) if models else model.step_time_s(start)
        edge = median(_edge_s(m, a) for m, a in models) if models else _edge_s(model, start)
        out.append({"mode": row["mode"], "measured_s": row["step_s_steady"], "repredicted_s": now,
                    "error": now / row["step_s_steady"] - 1, "recorded_error": row.get("prediction_error"),
                    "one_calibration_error": model.step_time_s(start) / row["step_s_steady"] - 1,
                    "before_error": row.get("prediction_error_before"), "epoch_edge_s": edge})
    return out


def _edge_s(model, compute_s: float) -> float:
    """The epoch edge as the model's step time charges it (spread over `epoch_steps`), whole."""
    free = replace(model, epoch_steps=None).step_time_s(compute_s)
    return (model.step_time_s(compute_s) - free) * (model.epoch_steps or 0)


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def store_and_files(doc: str, argv: list[str]) -> tuple[Any, list[str]]:
    """The command line the data-record scripts share: a store directory (its index, which the
    model replays need) and the record or runs files to read. Unknown options are errors."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", metavar="STORE_DIR", help="the data store the records were measured on")
    parser.add_argument("files", metavar="FILE", nargs="+", help="data-bench records or runs files")
    args = parser.parse_args(argv)
    try:
        return Store(args.store).index(), args.files
    except CaramelError as e:
        parser.error(str(e))


def correlation_or_nan(xs: list[float], ys: list[float]) -> float:
    """Pearson's r, NaN where it is undefined (fewer than two points, or a constant side)."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return float("nan")
    return correlation(xs, ys)


def main(argv: list[str]) -> int:
    index, files = store_and_files(__doc__, argv)
    for where, record in stored_records_of(files):
        if missing_inputs(record):
            print(f"{where}  not rescored: its rows lack {', '.join(missing_inputs(record))} "
                  f"(format {record.get('format')})")
            continue
        for r in repredict(record, index):
            print(f"{where}  {r['mode']:<9} measured {r['measured_s'] * 1e3:6.2f} ms  "
                  f"repredicted {r['repredicted_s'] * 1e3:6.2f} ms ({r['error']:+.0%})  "
                  f"epoch edge {r['epoch_edge_s'] * 1e3:5.1f} ms  "
                  f"recorded {_percent(r['recorded_error'])}  one calibration {r['one_calibration_error']:+.0%}  "
                  f"before {_percent(r['before_error'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
