"""Where the plain loader's closed loop sits against its knee in stored data-bench records, and
what candidate changes of the model do to the read-time slope.

At 100 Mbit/s the plain loader's step follows the read under load about half as steeply as the
model (experiments.data_read_slope). Three readings of the records, per configuration:

- **Within runs, round by round**: each round's step (the mean of its steady epochs) and the
  model's prediction of that round against the round's own read under load, each less its run's
  mean, so the host's load from run to run drops out: the least-squares slopes, ms per ms.
- **In the epochs' steady steps** (records that keep rank 0's steps, `epoch_step_s`): an epoch's
  steps past its first pair (the two workers deliver in pairs) against the bytes of a step at the
  store's rate: the share of the link's rate the loop delivers once started, beside the model's
  steady data period (its step without the epoch edge) for the same rounds.
- **Candidate changes**, each replayed on every record: the worker's local work not stretched by
  workers / cores (`local x1`), the batch's trip left to the training process (`no trip`), the
  store's own serial work as a second station with the read under load less it in the think time
  (`2 stations`), and the queue left out (the loop's asymptotic bound, `bound`). Slopes and rows
  within 15%, for the records given with --build (what a change would be chosen on) and the rest.

Usage: python -m experiments.data_knee STORE_DIR FILE... [--build FILE...]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from contextlib import ExitStack
from statistics import fmean, median
from typing import Any
from unittest import mock

if __package__ in (None, ""):  # run as a file: `experiments` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import caramel.data.io_model as io_model  # noqa: E402
from caramel.bench.data_report import stored_records_of  # noqa: E402
from caramel.data.store import Store  # noqa: E402
from caramel.errors import CaramelError  # noqa: E402
from experiments.data_model_repredict import row_models  # noqa: E402
from experiments.data_read_slope import bound_loop, plain_rows, slope  # noqa: E402


def _key(record: dict[str, Any]) -> str:
    c = record["config"]
    return f"{c['store_rate_bps'] / 1e6:g} Mbit/s, batch {c['batch_size']}, cache share {c['cache_share']:g}"


def round_points(record: dict[str, Any], index) -> list[tuple[float, float, float]]:
    """(read under load, measured step, model's step) of each probed round of the plain loader."""
    row = next(r for r in record["rows"] if r["mode"] == "remote")
    per = record["config"]["epochs"] - 1
    steady = row["epoch_means_steady_s"]
    _, models, _ = row_models(record, index, row)  # one per calibration, in the calibrations' order
    rounds = [m.step_time_s(a) for m, a in models]
    return [(c["request_s_under_load"], fmean(steady[k * per:(k + 1) * per]), rounds[k])
            for k, c in enumerate(row["calibrations"]) if c.get("request_s_under_load") is not None]


def within_run_slopes(records: dict[str, dict[str, Any]], index) -> dict[str, tuple[int, float, float]]:
    """Per configuration: rounds, and the slopes of the measured and modelled round step on the
    round's read, each taken from its run's mean."""
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for record in records.values():
        points = round_points(record, index)
        if len(points) < 2:
            continue
        mr, mm, mp = (fmean(p[i] for p in points) for i in range(3))
        groups.setdefault(_key(record), []).extend((r - mr, m - mm, p - mp) for r, m, p in points)
    out = {}
    for key, g in groups.items():
        sxx = sum(r * r for r, _, _ in g)
        if sxx > 0:
            out[key] = (len(g), sum(r * m for r, m, _ in g) / sxx, sum(r * p for r, _, p in g) / sxx)
    return out


def steady_link_share(record: dict[str, Any], index) -> tuple[float, float, float] | None:
    """(the epochs' steady step past their first pair, the step's bytes at the store's rate, the
    model's steady data period), medians over the steady epochs, or None without per-step times."""
    row = next(r for r in record["rows"] if r["mode"] == "remote")
    if "epoch_step_s" not in row:
        return None
    epochs = record["config"]["epochs"]
    steps = []
    for i, es in enumerate(row["epoch_step_s"]):
        if i % epochs >= 1 and len(es) >= 4:
            pairs = [es[j] + es[j + 1] for j in range(2, len(es) - 1, 2)]
            steps.append(fmean(pairs) / 2)
    link_s = row["remote_bytes_per_epoch_steady"] * 8 / record["config"]["store_rate_bps"] / len(row["epoch_step_s"][1])
    _, models, _ = row_models(record, index, row)
    # the rounds charged a read under load (a round without a probe read has none to queue on)
    periods = [m.data_time_s() for m, _ in models if m.worker_request_s]
    return median(steps), link_s, median(periods) if periods else float("nan")


def _range_reads(local_factor: str = "cores", second_station: bool = False):
    """The model's range-read period with one change (`DataLoadModel._range_reads_s` otherwise)."""
    def period_s(self, remote: float) -> float:
        k = max(self.loader_workers, 1)
        reads = math.ceil(remote / self.sample_bytes - 1e-9)
        link_s = remote * 8.0 / self.store_bandwidth_bps
        server_s = reads * self.request_overhead_s
        local = {"cores": self._local_work_s() * k / self._local_cores(), "x1": self._local_work_s(),
                 "no trip": (self._local_work_s() - self.batch_overhead_s) * k / self._local_cores()}[local_factor]
        read_s = max(self.worker_request_s - self.request_overhead_s, 0.0) if second_station else self.worker_request_s
        think_s = reads * (self.store_latency_s + read_s) + local
        if not second_station:
            return self.ranks / io_model.closed_loop(self.ranks * k, think_s, max(link_s, server_s)).throughput_per_s
        demands, queued, x = [link_s, server_s], [0.0, 0.0], 0.0
        for n in range(1, self.ranks * k + 1):  # mean value analysis over two fixed-service stations
            waits = [d * (1 + max(q - x * d, 0.0) + x * d / 2) for d, q in zip(demands, queued)]
            x = min(n / (think_s + sum(waits)), 1.0 / max(demands))
            queued = [x * w for w in waits]
        return self.ranks / x
    return period_s


CANDIDATES = {
    "current": [],
    "local x1": [("_range_reads_s", _range_reads("x1"))],
    "no trip": [("_range_reads_s", _range_reads("no trip"))],
    "2 stations": [("_range_reads_s", _range_reads(second_station=True))],
    "bound": [("closed_loop", bound_loop)],
}


def candidate_rows(records: dict[str, dict[str, Any]], index, name: str) -> list[dict[str, Any]]:
    with ExitStack() as stack:
        for attr, fn in CANDIDATES[name]:
            target = io_model if attr == "closed_loop" else io_model.DataLoadModel
            stack.enter_context(mock.patch.object(target, attr, fn))
        return plain_rows(records, index)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", metavar="STORE_DIR", help="the data store the records were measured on")
    parser.add_argument("files", metavar="FILE", nargs="+", help="data-bench records or runs files")
    parser.add_argument("--build", metavar="FILE", nargs="*", default=[],
                        help="of the files, those a change would be chosen on (scored apart from the rest)")
    args = parser.parse_args(argv)
    try:
        index = Store(args.store).index()
    except CaramelError as e:
        parser.error(str(e))
    build = {w for w, _ in stored_records_of(args.build)}
    records = {w: r for w, r in stored_records_of(args.files + args.build)
               if any(x["mode"] == "remote" and x.get("request_s_under_load") is not None for x in r["rows"])}
    sets = {"build": {w: r for w, r in records.items() if w in build},
            "rest": {w: r for w, r in records.items() if w not in build}}
    print("within runs, round by round (ms of step per ms of read):")
    for label, group in sets.items():
        for key, (n, measured, model) in sorted(within_run_slopes(group, index).items()):
            print(f"  {label:<5} {key}: {n} rounds, measured {measured:.2f}, model {model:.2f}")
    print("steady steps past each epoch's first pair against the step's bytes at the store's rate:")
    for where, record in records.items():
        share = steady_link_share(record, index)
        if share is not None:
            step, link, model = share
            read_s = next(r for r in record["rows"] if r["mode"] == "remote")["request_s_under_load"]
            print(f"  {where}: read under load {read_s * 1e3:.2f} ms; {step * 1e3:.2f} ms, link {link * 1e3:.2f} ms "
                  f"({link / step:.1%} of the rate), "
                  f"model's steady data period {model * 1e3:.2f} ms ({link / model:.1%})")
    print("candidate changes (slope measured vs modelled, ms per ms; rows within 15%):")
    for name in CANDIDATES:
        for label, group in sets.items():
            if not group:
                continue
            rows = candidate_rows(group, index, name)
            cells = []
            for key in sorted({r["key"] for r in rows}):
                g = [r for r in rows if r["key"] == key]
                reads = [r["read_s"] for r in g]
                fit = (f"{slope(reads, [r['measured_s'] for r in g]):.2f} vs {slope(reads, [r['model_s'] for r in g]):.2f}"
                       if len(set(reads)) > 1 else "-")
                cells.append(f"{key[0] / 1e6:g}/{key[2]:g}: {fit}, {min(r['error'] for r in g):+.1%}.."
                             f"{max(r['error'] for r in g):+.1%} ({sum(abs(r['error']) <= 0.15 for r in g)}/{len(g)})")
            print(f"  {name:<10} {label:<5} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
