"""How the plain loader's step follows the read under load, measured and modelled, in stored
data-bench records.

Per configuration (store rate, batch, cache share), over the plain-loader ("remote") rows of the
records given: the least-squares slope of the measured step and of the model's (the current
model, replayed by `experiments.data_model_repredict`) against the rounds' median read under
load (`request_s_under_load`), ms of step per ms of read; the correlation of the model's error
with the read; the reads' range. Then the same rows scored with the closed loop at its
asymptotic bound (no queueing: throughput min(n / (think + demand), 1 / demand)) in place of
mean value analysis: the errors' range and how many of the rows are within 15%.

A configuration with fewer than two distinct reads has no slope and is said so.
Usage: python -m experiments.data_read_slope STORE_DIR FILE...   (records or runs files)
"""
from __future__ import annotations

import os
import sys
from statistics import fmean
from typing import Any
from unittest import mock

if __package__ in (None, ""):  # run as a file: `experiments` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import caramel.data.io_model as io_model  # noqa: E402
from caramel.bench.data_report import stored_records_of  # noqa: E402
from experiments.data_model_repredict import correlation_or_nan, repredict, store_and_files  # noqa: E402


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs."""
    mx, my = fmean(xs), fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def bound_loop(clients: int, think_s: float, demand_s: float, arrival_scv: float = 1.0) -> io_model.LoopState:
    """The closed loop's asymptotic bound: no queue, only the link's own limit (whatever the arrivals' spread)."""
    # arrival_scv is unused: it is there only so that this can stand in for closed_loop's signature
    throughput = min(clients / (think_s + demand_s), 1.0 / demand_s)
    return io_model.LoopState(clients, throughput, 0.0, demand_s)


def plain_rows(records: dict[str, dict[str, Any]], index) -> list[dict[str, Any]]:
    """Each record's plain-loader row: its configuration, read under load, measured and modelled step."""
    out = []
    for name, record in records.items():
        cfg = record["config"]
        rows = {r["mode"]: r for r in record["rows"]}
        if "remote" not in rows or rows["remote"].get("request_s_under_load") is None:
            continue
        scored = {r["mode"]: r for r in repredict(record, index)}
        with mock.patch.object(io_model, "closed_loop", bound_loop):
            bound = {r["mode"]: r for r in repredict(record, index)}
        out.append(dict(name=name, key=(cfg["store_rate_bps"], cfg["batch_size"], cfg["cache_share"]),
                        read_s=rows["remote"]["request_s_under_load"], measured_s=scored["remote"]["measured_s"],
                        model_s=scored["remote"]["repredicted_s"], error=scored["remote"]["error"],
                        bound_error=bound["remote"]["error"]))
    return out


def main(argv: list[str]) -> int:
    index, files = store_and_files(__doc__, argv)
    rows = plain_rows(dict(stored_records_of(files)), index)
    for key in sorted({r["key"] for r in rows}):
        group = [r for r in rows if r["key"] == key]
        reads = [r["read_s"] for r in group]
        where = f"{key[0] / 1e6:g} Mbit/s, batch {key[1]}, cache share {key[2]:g}: {len(group)} runs"
        if len(set(reads)) < 2:
            print(f"{where}: too few for a slope (fewer than two distinct reads)")
            continue
        print(f"{where}, "
              f"reads {min(reads) * 1e3:.2f}-{max(reads) * 1e3:.2f} ms; slope measured "
              f"{slope(reads, [r['measured_s'] for r in group]):.2f}, model {slope(reads, [r['model_s'] for r in group]):.2f} "
              f"ms per ms; error against read r = {correlation_or_nan(reads, [r['error'] for r in group]):.2f}; "
              f"at the loop's asymptotic bound errors {min(r['bound_error'] for r in group):+.1%}.."
              f"{max(r['bound_error'] for r in group):+.1%} "
              f"({sum(1 for r in group if abs(r['bound_error']) <= 0.15)} of {len(group)} within 15%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
