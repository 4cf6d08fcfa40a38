"""Score data-bench records with the link's queue as charged before read spreads (the old model)
and with it scaled by the reads' spread (the new one, `caramel.data.link_queue`).

The old model is each round's model with the probe's kept reads taken out of its calibrations
(the round's median read, the queue of Poisson-like arrivals: the bench's default); the new one
is `round_models(..., read_spreads=True)` (where a round kept at least two reads, their mean and
SCV). A record without
kept reads (every stored run before caramel.data-bench/6) scores the same under both. For the
plain loader's rows two halves of the change are printed as well: the median read with the
spread (`spread only`) and the mean read without it (`mean only`). Per run: every row within 15%
or not; per configuration: the rows' ranges and counts within 15%; the rounds' arrival SCVs.

Usage: python -m experiments.data_knee_spread STORE_DIR FILE... [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from statistics import median
from typing import Any

if __package__ in (None, ""):  # run as a file: `experiments` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caramel.bench.data_report import stored_records_of  # noqa: E402
from caramel.data.store import Store  # noqa: E402
from caramel.errors import CaramelError  # noqa: E402
from caramel.stats import t_interval  # noqa: E402
from experiments.data_model_repredict import missing_inputs, row_models  # noqa: E402

KIND = "caramel.data-knee-spread/1"
WITHIN = 0.15
ARMS = ("old", "new", "spread only", "mean only")


def _without_spreads(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with every calibration's kept reads taken out: what the model saw before them."""
    rows = [dict(row, calibrations=[{k: v for k, v in c.items() if k != "request_s_under_load_each"}
                                    for c in row.get("calibrations", [])]) for row in record["rows"]]
    return dict(record, rows=rows)


def _step_s(models: list[tuple[Any, float]]) -> float:
    return median(m.step_time_s(a) for m, a in models)


def _loop_scv(model, charged: bool = True) -> float | None:
    """The arrivals' SCV the new model charges a range-read round, or (`charged` False) its reads'
    think time's before the cap at 1 (None: no spread measured): the model's own number."""
    return model.link_arrival_scv(capped=charged)


def score_record(record: dict[str, Any], index) -> list[dict[str, Any]]:
    """Each row's measured step and the four arms' predictions (median over rounds) and errors."""
    plain = _without_spreads(record)
    out = []
    for row, old_row in zip(record["rows"], plain["rows"]):
        _, new, _ = row_models(record, index, row, read_spreads=True)
        _, old, _ = row_models(plain, index, old_row)  # kept reads out: the default could not see them
        if not new:
            continue
        measured = row["step_s_steady"]
        spread_only = [(replace(m, worker_request_s=o.worker_request_s), a) for (m, a), (o, _) in zip(new, old)]
        mean_only = [(replace(m, worker_request_scv=None), a) for m, a in new]
        steps = dict(zip(ARMS, map(_step_s, (old, new, spread_only, mean_only))))
        scvs = [_loop_scv(m) for m, _ in new]
        out.append({"mode": row["mode"], "measured_s": measured,
                    "predicted_s": steps, "error": {k: v / measured - 1 for k, v in steps.items()},
                    "read_mean_s": [m.worker_request_s for m, _ in new],
                    "read_median_s": [m.worker_request_s for m, _ in old],
                    "read_scv": [m.worker_request_scv for m, _ in new],
                    "arrival_scv": scvs, "think_scv": [_loop_scv(m, charged=False) for m, _ in new]})
    return out


def config_key(record: dict[str, Any]) -> str:
    c = record["config"]
    return (f"{c['store_rate_bps'] / 1e6:g} Mbit/s, {c['store_latency_s'] * 1e3:g} ms, batch {c['batch_size']}, "
            f"cache share {c['cache_share']:g}")


def summarize(scored: dict[str, tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Runs with every row within 15% and, per configuration and mode, each arm's rows within and range."""
    empty = sorted(w for w, (_, rows) in scored.items() if not rows)  # no row to be within 15%: counted apart
    runs = {arm: sum(all(abs(r["error"][arm]) <= WITHIN for r in rows) for _, rows in scored.values() if rows)
            for arm in ARMS}
    groups: dict[str, dict[str, list[float]]] = {}
    for key, rows in scored.values():
        for r in rows:
            for arm in ARMS:
                groups.setdefault(f"{key} | {r['mode']}", {}).setdefault(arm, []).append(r["error"][arm])
    by_group = {g: {arm: {"within": sum(abs(e) <= WITHIN for e in es), "rows": len(es), "min": min(es),
                          "max": max(es), "mean_abs": sum(abs(e) for e in es) / len(es),
                          # |error| less the old model's on the same rows: mean and 95% t interval
                          "abs_less_old": (t_interval([abs(e) - abs(o) for e, o in zip(es, arms["old"])])
                                           if len(es) >= 2 else None)}
                    for arm, es in arms.items()} for g, arms in sorted(groups.items())}
    return {"runs": len(scored) - len(empty), "runs_without_rows": empty, "runs_every_row_within": runs,
            "groups": by_group}


def _reads(r: dict[str, Any]) -> str:
    """The rounds' kept reads: mean less median (ms) and SCV ranges."""
    gaps = [(a - b) * 1e3 for a, b in zip(r["read_mean_s"], r["read_median_s"])]
    scv = [v for v in r["read_scv"] if v is not None]
    return f"  reads: mean - median {min(gaps):+.2f}..{max(gaps):+.2f} ms, SCV {min(scv):.2f}..{max(scv):.2f}"


def _less_old(s: dict[str, Any]) -> str:
    if s["abs_less_old"] is None or s["abs_less_old"] == (0.0, 0.0, 0.0):
        return ""
    mean, lo, hi = s["abs_less_old"]
    return f", vs old {mean:+.1%} [{lo:+.1%}, {hi:+.1%}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", metavar="STORE_DIR", help="the data store the records were measured on")
    parser.add_argument("files", metavar="FILE", nargs="+", help="data-bench records or runs files")
    parser.add_argument("--json", metavar="OUT", help="write every row and the summary here")
    args = parser.parse_args(argv)
    try:
        index = Store(args.store).index()
    except CaramelError as e:
        parser.error(str(e))
    try:
        records = list(stored_records_of(args.files))
    except (OSError, ValueError, CaramelError) as e:  # a missing file, not JSON, not a data-bench record
        parser.error(f"FILE must be data-bench records or runs files: {e}")
    scored = {}
    for where, record in records:
        if missing_inputs(record):
            print(f"{where}  not scored: its rows lack {', '.join(missing_inputs(record))}")
            continue
        rows = score_record(record, index)
        scored[where] = (config_key(record), rows)
        for r in rows:
            think = [s for s in r["think_scv"] if s is not None]
            print(f"{where}  {r['mode']:<9} measured {r['measured_s'] * 1e3:6.2f} ms  "
                  + "  ".join(f"{arm} {r['error'][arm]:+.1%}" for arm in ARMS)
                  + (f"  think SCV {min(think):.3f}..{max(think):.3f}" if think else "")
                  + (_reads(r) if any(v is not None for v in r["read_scv"]) else ""))
    summary = summarize(scored)
    if summary["runs_without_rows"]:
        print(f"runs with no row scored (not counted): {', '.join(summary['runs_without_rows'])}")
    print(f"runs with every row within 15% (of {summary['runs']}): "
          + ", ".join(f"{arm} {n}" for arm, n in summary["runs_every_row_within"].items()))
    for group, arms in summary["groups"].items():
        print(f"  {group}: " + " | ".join(f"{arm} {s['within']}/{s['rows']} {s['min']:+.1%}..{s['max']:+.1%} "
                                          f"(mean |e| {s['mean_abs']:.2%}{_less_old(s)})" for arm, s in arms.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": KIND, "files": args.files, "summary": summary,
                       "rows": {w: {"config": k, "rows": rows} for w, (k, rows) in scored.items()}}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
