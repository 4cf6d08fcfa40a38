"""Where the cached and locality rows' predictions come from, round by round, in stored data-bench records.

With everything cached the locality mode's loading (memory hits: decode and the batch's trip) is
far below its compute side, so the model's step is the compute side, which is the calibration's
loaded step (contention x (floor + trip)), plus the epoch's edge. This prints, per record and
caramel.data row: the measured step, the model's, the data period against the compute side, and
per round the calibration's loaded step (its wait and all-reduce) beside that round's epochs;
then, per configuration, how the calibrations compare with the rounds they calibrate (the ratio
of their median to the measured step, the correlation of a round's calibration with its epochs,
the mean wait of mode and calibration). Where a record has each step (`epoch_step_s`) and the
calibrations' restarts (`restart_step_s`), the epochs' start (their first two steps over the
rest) beside the calibrations' measured restart.

A row without a loaded calibration (calibration off) has no rounds to compare: it is printed
with a note and left out of its configuration's summary.
Usage: python -m experiments.data_locality_rounds STORE_DIR FILE...   (records or runs files)
"""
from __future__ import annotations

import os
import sys
from statistics import fmean, median, pstdev
from typing import Any

if __package__ in (None, ""):  # run as a file: `experiments` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caramel.bench.data_contention import epoch_start_excess_s  # noqa: E402
from caramel.bench.data_report import stored_records_of  # noqa: E402
from experiments.data_model_repredict import correlation_or_nan, repredict, store_and_files  # noqa: E402

MODES = ("cached", "locality")


def epoch_starts_s(row: dict[str, Any], epochs: int) -> list[float]:
    """Each steady epoch's first two steps over two of its other steps' mean (rank 0's steps)."""
    out = []
    for i, steps in enumerate(row.get("epoch_step_s") or []):
        if i % epochs == 0 or len(steps) < 4:
            continue  # the first epoch of a round fills the cache
        rest = fmean(steps[2:])
        out.append(steps[0] + steps[1] - 2 * rest)
    return out


def rows_of(record: dict[str, Any], index) -> list[dict[str, Any]]:
    """The caramel.data rows of one record with their model's parts and the rounds' calibrations."""
    scored = {r["mode"]: r for r in repredict(record, index)}
    epochs = record["config"]["epochs"]
    out = []
    for row in record["rows"]:
        if row["mode"] not in MODES:
            continue
        means = row["epoch_means_steady_s"]
        per_round = max(len(means) // max(len(row["calibrations"]), 1), 1)
        rounds = [dict(loaded_s=c["loaded"]["step_s"], wait_s=c["loaded"]["wait_s"], sync_s=c["loaded"]["sync_s"],
                       epochs_s=means[i * per_round:(i + 1) * per_round])
                  for i, c in enumerate(row["calibrations"]) if c.get("loaded")]
        out.append(dict(mode=row["mode"], measured_s=row["step_s_steady"], predicted_s=scored[row["mode"]]["repredicted_s"],
                        data_s=row["predicted_data_s"], wait_s=row["wait_s_steady"], sync_s=row["sync_s_steady"],
                        rounds=rounds, restarts_s=[epoch_start_excess_s(c.get("loaded")) for c in row["calibrations"]],
                        epoch_starts_s=epoch_starts_s(row, epochs),
                        has_restart=any(epoch_start_excess_s(c.get("loaded")) is not None for c in row["calibrations"])))
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Over rows of one configuration and mode: the calibrations against the rounds they calibrate."""
    ratio = [median(r["loaded_s"] for r in row["rounds"]) / row["measured_s"] for row in rows]
    pairs = [(r["loaded_s"], fmean(r["epochs_s"])) for row in rows for r in row["rounds"]]
    return dict(runs=len(rows), ratio_mean=fmean(ratio), ratio_sd=pstdev(ratio),
                round_correlation=correlation_or_nan(*map(list, zip(*pairs))) if len(pairs) > 2 else float("nan"),
                mode_wait_s=fmean(row["wait_s"] for row in rows),
                calibration_wait_s=fmean(r["wait_s"] for row in rows for r in row["rounds"]),
                errors=[row["predicted_s"] / row["measured_s"] - 1 for row in rows])


def main(argv: list[str]) -> int:
    index, files = store_and_files(__doc__, argv)
    groups: dict[tuple, list] = {}
    for where, record in stored_records_of(files):
        cfg = record["config"]
        key = (cfg["store_rate_bps"], cfg["batch_size"], cfg["cache_share"])
        for row in rows_of(record, index):
            print(f"{where} {row['mode']:<8} measured {row['measured_s'] * 1e3:6.2f} ms, "
                  f"model {row['predicted_s'] * 1e3:6.2f} ({row['predicted_s'] / row['measured_s'] - 1:+.1%}); "
                  f"data {row['data_s'] * 1e3:.2f} ms; wait {row['wait_s'] * 1e3:.2f}, all-reduce {row['sync_s'] * 1e3:.2f}")
            if not row["rounds"]:
                print("    no loaded calibration: left out of the summary")
                continue
            groups.setdefault(key + (row["mode"],), []).append(row)
            for i, r in enumerate(row["rounds"]):
                print(f"    round {i}: calibration {r['loaded_s'] * 1e3:5.2f} ms (wait {r['wait_s'] * 1e3:.2f}, "
                      f"all-reduce {r['sync_s'] * 1e3:.2f}); its epochs "
                      + " ".join(f"{e * 1e3:.2f}" for e in r["epochs_s"]))
            if row["has_restart"]:
                print("    epochs' start (first two steps over the rest) "
                      + " ".join(f"{s * 1e3:.1f}" for s in row["epoch_starts_s"])
                      + " ms; calibrations' restart "
                      + " ".join("-" if s is None else f"{s * 1e3:.1f}" for s in row["restarts_s"]) + " ms")
    scored = [r for rows in groups.values() for r in rows]
    print(f"cached and locality rows under-predicted: {sum(r['predicted_s'] < r['measured_s'] for r in scored)} "
          f"of {len(scored)} (rows with a loaded calibration)")
    for (rate, batch, share, mode), rows in sorted(groups.items()):
        s = summary(rows)
        print(f"{rate / 1e6:g} Mbit/s, batch {batch}, cache share {share:g}, {mode}: {s['runs']} runs, "
              f"errors {min(s['errors']):+.1%}..{max(s['errors']):+.1%} (mean {fmean(s['errors']):+.1%}); "
              f"calibrations' median / measured "
              f"{s['ratio_mean']:.3f} (sd {s['ratio_sd']:.3f}); a round's calibration against its epochs: r = "
              f"{s['round_correlation']:.2f}; wait mode {s['mode_wait_s'] * 1e3:.2f} ms, calibration "
              f"{s['calibration_wait_s'] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
