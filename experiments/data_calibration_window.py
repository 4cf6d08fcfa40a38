"""Score the data bench's calibration windows: how far a locality row's prediction strays from its
measured step, run to run, with each window and summary.

The runs to compare are data-bench records taken with different `--calibration-window` /
`--calibration-sub-windows` (each calibration records its `window_steps`, `sub_windows` and every
step after the warm-up, `steps_s`). Each record's arm is its calibrations' window in steps. Per
arm and per summary of the stored steps, replayed through the model
(`experiments.data_model_repredict.repredict` with each calibration's loaded step summed up
again): the errors' mean, standard deviation, range and runs within 15%, and the correlation of
each round's calibration with its own round's steady epochs (the calibration's job: to follow its
round). Summaries: `recorded` (what the run used), `mean` (of every stored step), `median:K` (of
K consecutive sub-windows' means) and `first:N` (the mean of the first N stored steps: the 40-step
window's 38 inside a longer one). Last, the standard deviation's ratio between the arms with its
95% interval (F distribution: independent runs, errors taken as normal).

Usage: python -m experiments.data_calibration_window STORE_DIR FILE... [--mode locality]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from statistics import fmean, median, stdev
from typing import Any, Callable

if __package__ in (None, ""):  # run as a file: `experiments` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caramel.bench.calibration_window import window_summary  # noqa: E402
from caramel.bench.data_report import stored_records_of  # noqa: E402
from caramel.data.store import Store  # noqa: E402
from caramel.errors import CaramelError  # noqa: E402
from experiments.data_model_repredict import correlation_or_nan, repredict  # noqa: E402

SUMMARIES: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda xs: window_summary(xs, 1),
    "median:4": lambda xs: window_summary(xs, 4),
    "median:8": lambda xs: window_summary(xs, 8),
    "first:38": lambda xs: window_summary(xs[:38], 1),
}


def window_of(record: dict[str, Any], mode: str) -> int | None:
    """The record's calibration window in steps (its mode's calibrations'); None without stored steps."""
    row = next((r for r in record["rows"] if r["mode"] == mode), None)
    cals = [c for c in (row or {}).get("calibrations", []) if c.get("loaded") and "steps_s" in c["loaded"]]
    if not cals:
        return None
    return cals[0].get("window_steps", len(cals[0]["loaded"]["steps_s"]) + 2)


def resummarised(record: dict[str, Any], summary: Callable[[list[float]], float]) -> dict[str, Any]:
    """A copy of `record` with every calibration's loaded step summed up by `summary` over its steps."""
    out = copy.deepcopy(record)
    for row in out["rows"]:
        for c in row.get("calibrations", []):
            if c.get("loaded") and c["loaded"].get("steps_s"):
                c["loaded"]["step_s"] = summary(c["loaded"]["steps_s"])
    return out


def round_pairs(record: dict[str, Any], mode: str) -> list[tuple[float, float]]:
    """(a round's calibration loaded step, the mean of that round's steady epochs) of `mode`."""
    epochs = record["config"]["epochs"]
    row = next(r for r in record["rows"] if r["mode"] == mode)
    steady = row["epoch_means_steady_s"]
    per_round = epochs - 1
    return [(c["loaded"]["step_s"], fmean(steady[k * per_round:(k + 1) * per_round]))
            for k, c in enumerate(row["calibrations"]) if c.get("loaded")]


def bias_breakdown(records: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """Where the prediction's bias sits, in s: the medians over every calibration of `mode` in
    `records` of its loaded pass's mean step, wait and all-reduce (`cal_*`), and the medians over
    the runs of the row's steady step, wait and all-reduce (`row_*`) and of each run's median over
    its steady epochs of the epoch's mean step past its first two (`row_step_past_two`)."""
    cals = [c["loaded"] for r in records for row in r["rows"] if row["mode"] == mode
            for c in row.get("calibrations", []) if c.get("loaded")]
    rows = [next(x for x in r["rows"] if x["mode"] == mode) for r in records]
    past_two = []
    for r, row in zip(records, rows):
        epochs = r["config"]["epochs"]
        past_two.append(median(fmean(es[2:]) for i, es in enumerate(row["epoch_step_s"])
                               if i % epochs >= 1 and len(es) > 2))
    return {"calibrations": len(cals), "cal_step": median(c.get("step_s_mean", c["step_s"]) for c in cals),
            "cal_wait": median(c["wait_s"] for c in cals), "cal_sync": median(c["sync_s"] for c in cals),
            "row_step": median(x["step_s_steady"] for x in rows), "row_wait": median(x["wait_s_steady"] for x in rows),
            "row_sync": median(x["sync_s_steady"] for x in rows), "row_step_past_two": median(past_two)}


def error_of(record: dict[str, Any], index, mode: str) -> float:
    return next(r["error"] for r in repredict(record, index) if r["mode"] == mode)


def _cv(xs: list[float]) -> float:
    return stdev(xs) / fmean(xs) if len(xs) > 1 else float("nan")


def sd_ratio_interval(a: list[float], b: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """sd(b) / sd(a) with its interval from the F distribution of the variance ratio."""
    from scipy.stats import f

    ratio = (stdev(b) / stdev(a)) ** 2
    lo, hi = f.ppf([(1 - confidence) / 2, (1 + confidence) / 2], len(b) - 1, len(a) - 1)
    return ratio ** 0.5, (ratio / hi) ** 0.5, (ratio / lo) ** 0.5


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", metavar="STORE_DIR", help="the data store the records were measured on")
    parser.add_argument("files", metavar="FILE", nargs="+", help="data-bench records or runs files")
    parser.add_argument("--mode", default="locality", help="the row to score (default locality)")
    args = parser.parse_args(argv)
    try:
        index = Store(args.store).index()
    except CaramelError as e:
        parser.error(str(e))
    arms: dict[int, list[dict[str, Any]]] = {}
    for where, record in stored_records_of(args.files):
        steps = window_of(record, args.mode)
        if steps is None:
            print(f"{where}: no {args.mode} calibration with stored steps (records before the window option); left out")
            continue
        arms.setdefault(steps, []).append(record)
    if not arms:
        parser.error(f"no record has a {args.mode} row with stored calibration steps")
    errors: dict[tuple[int, str], list[float]] = {}
    for steps, records in sorted(arms.items()):
        print(f"window {steps} steps: {len(records)} runs")
        for name in ["recorded", *SUMMARIES]:
            if name == "first:38" and steps <= 40:
                continue
            scored = [r if name == "recorded" else resummarised(r, SUMMARIES[name]) for r in records]
            errs = [error_of(r, index, args.mode) for r in scored]
            pairs = [p for r in scored for p in round_pairs(r, args.mode)]
            errors[(steps, name)] = errs
            predicted = [next(x["repredicted_s"] for x in repredict(r, index) if x["mode"] == args.mode) for r in scored]
            measured = [next(x["step_s_steady"] for x in r["rows"] if x["mode"] == args.mode) for r in scored]
            print(f"  {name:<9} error mean {fmean(errs):+.1%} sd {stdev(errs) if len(errs) > 1 else float('nan'):.1%} "
                  f"range {min(errs):+.1%}..{max(errs):+.1%}, within 15% {sum(abs(e) <= 0.15 for e in errs)} of "
                  f"{len(errs)}; a round's calibration against its epochs r = "
                  f"{correlation_or_nan([a for a, _ in pairs], [b for _, b in pairs]):.2f} ({len(pairs)} rounds); "
                  f"across runs the prediction's cv {_cv(predicted):.1%}, the measured step's {_cv(measured):.1%}, "
                  f"their correlation {correlation_or_nan(predicted, measured):.2f}")
        b = bias_breakdown(records, args.mode)
        print(f"  bias, ms: calibrations' step {b['cal_step'] * 1e3:.2f}, wait {b['cal_wait'] * 1e3:.2f}, all-reduce "
              f"{b['cal_sync'] * 1e3:.2f} ({b['calibrations']} calibrations); the mode's steady step {b['row_step'] * 1e3:.2f}, wait {b['row_wait'] * 1e3:.2f}, "
              f"all-reduce {b['row_sync'] * 1e3:.2f}, past each epoch's first two steps "
              f"{b['row_step_past_two'] * 1e3:.2f} (medians over the runs)")
    if len(arms) == 2:
        short, long_ = sorted(arms)
        for name in ["recorded", *SUMMARIES]:
            a, b = errors.get((short, "mean" if name == "recorded" else name)), errors.get((long_, name))
            if a and b and len(a) > 1 and len(b) > 1:
                ratio, lo, hi = sd_ratio_interval(a, b)
                print(f"sd of the errors, {long_} steps ({name}) over {short} steps "
                      f"({'mean' if name == 'recorded' else name}): {ratio:.2f} (95% {lo:.2f}-{hi:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
