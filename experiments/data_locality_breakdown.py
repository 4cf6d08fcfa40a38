"""Each stored locality row's model error, broken into the model's terms and what the run measured.

The locality prediction is, round by round, the calibration's loaded step (contention x (floor +
trip)) plus the model's own terms (the epoch edge and restart, and with misses the data side),
the median over rounds. So its error against the measured step splits exactly into

    error = (model's own terms: prediction - the calibrations' median loaded step)
          + (the calibrations' median step - their mean step)             # aggregation
          + (calibrations' mean wait - the mode's wait)                   # the batch's wait
          + (calibrations' mean all-reduce - the mode's all-reduce)       # the other rank's arrival
          + (calibrations' mean rest - the mode's rest)                   # compute, the loop's own work

(rest = step - wait - all-reduce, rank 0's timing. A calibration's step is the mean over the
same steps as its wait and all-reduce (`step_s_mean`; `step_s` where a record lacks it), so on
that side the only median is in the aggregation. The mode's step, wait and all-reduce are three
separate medians of epoch means, so its rest also carries their mismatch. Each term in ms and
as a share of the measured step, so the five shares sum to the row's error). Beside them, what
the record measured of the data: hit rate, steady remote bytes, memory hits and disk hits per
epoch, the loader's prefetch depth, and (records keeping every step) the mode's steady steps past each epoch's first two.
Per group (configuration and the record's family) the mean of each term with its 95% t interval,
and across rows the correlation of each term with the error. Nothing is fitted.
Usage: python -m experiments.data_locality_breakdown STORE_DIR OUT_JSON FILE...   (records or runs files)
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from statistics import fmean
from typing import Any

if __package__ in (None, ""):  # run as a file: `experiments` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caramel.bench.data_report import stored_records_of  # noqa: E402
from caramel.stats import median, t_interval  # noqa: E402
from experiments.data_model_repredict import correlation_or_nan, repredict, store_and_files  # noqa: E402

KIND = "caramel.data-locality-breakdown/1"
TERMS = ("model_terms", "aggregation", "wait", "all_reduce", "rest")


def breakdown(row: dict[str, Any], predicted_s: float) -> dict[str, Any] | None:
    """The row's error split into TERMS (seconds), or None for a row without loaded calibrations."""
    cal = [c["loaded"] for c in row.get("calibrations", []) if c.get("loaded")]
    if not cal:
        return None
    step_s, wait_s, sync_s = row["step_s_steady"], row["wait_s_steady"], row["sync_s_steady"]
    c_step = [c["step_s"] for c in cal]
    # wait and all-reduce are means over the steps after the warm-up, and so is `step_s_mean` (kept
    # since /4); `step_s` may be a window's median, so its gap to the mean goes to the aggregation
    c_step_mean = fmean(c.get("step_s_mean", c["step_s"]) for c in cal)
    c_wait, c_sync = fmean(c["wait_s"] for c in cal), fmean(c["sync_s"] for c in cal)
    c_rest = c_step_mean - c_wait - c_sync
    terms_s = dict(model_terms=predicted_s - median(c_step), aggregation=median(c_step) - c_step_mean,
                   wait=c_wait - wait_s, all_reduce=c_sync - sync_s, rest=c_rest - (step_s - wait_s - sync_s))
    others = _other_ranks(row, cal)
    return dict(error=predicted_s / step_s - 1, other_ranks=others, error_s=predicted_s - step_s, terms_s=terms_s,
                shares={k: v / step_s for k, v in terms_s.items()},
                measured=dict(step_s=step_s, wait_s=wait_s, all_reduce_s=sync_s, rest_s=step_s - wait_s - sync_s,
                              steps_past_start_s=_past_start_s(row)),
                calibration=dict(step_s_median=median(c_step), step_s_mean=c_step_mean, wait_s=c_wait,
                                 all_reduce_s=c_sync, rest_s=c_rest,
                                 compute_s=fmean(c["compute_s"] for c in cal) if all("compute_s" in c for c in cal)
                                 else None),
                data=dict(hit_rate=row.get("hit_rate_steady"), remote_bytes=row.get("remote_bytes_per_epoch_steady"),
                          memory_hits=(row.get("tiers_per_epoch_steady") or {}).get("memory_hits"),
                          disk_hits=(row.get("tiers_per_epoch_steady") or {}).get("disk_hits"),
                          predicted_data_s=row.get("predicted_data_s")))


def _other_ranks(row: dict[str, Any], cal: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Per rank (records since caramel.data-bench/7): the calibrations' mean wait and all-reduce
    less the mode's, the same terms as rank 0's; None where the record kept rank 0's only."""
    waits, syncs = row.get("wait_s_steady_ranks"), row.get("sync_s_steady_ranks")
    kept = [c.get("other_ranks") for c in row.get("calibrations", []) if c.get("loaded")]
    if not waits or not syncs or not kept or any(k is None for k in kept):
        return None
    out = []
    for rank in range(1, len(waits)):
        mine = [o["loaded"] for k in kept for o in k if o["rank"] == rank and o.get("loaded")]
        if not mine:
            continue
        out.append(dict(rank=rank, wait=fmean(m["wait_s"] for m in mine) - waits[rank],
                        all_reduce=fmean(m["sync_s"] for m in mine) - syncs[rank],
                        mode_wait_s=waits[rank], mode_all_reduce_s=syncs[rank]))
    return out


def _past_start_s(row: dict[str, Any]) -> float | None:
    """The mean of the steady epochs' steps past each epoch's first two (None: steps not kept)."""
    steps = row.get("epoch_step_s")
    if not steps:
        return None
    per_round = len(steps) // max(len(row.get("calibrations") or [1]), 1)
    kept = [s for i, epoch in enumerate(steps) if per_round and i % per_round for s in epoch[2:]]
    return fmean(kept) if kept else None


def family(where: str) -> str:
    """The record's family from its name: accuracy, closed-loop, restart, window-old/new, or the file."""
    m = re.search(r"data-bench-(accuracy|closed-loop|restart)-", where)
    if m:
        return m.group(1)
    m = re.search(r"data-bench-window\.json:(old|new)-", where)
    return f"window-{m.group(1)}" if m else os.path.basename(where.split(":")[0])


def interval(xs: list[float]) -> list[float] | None:
    """[mean, low, high] of `xs` (95% t), None with fewer than two."""
    return list(t_interval(xs)) if len(xs) >= 2 else None


def _nan_to_null(x: Any) -> Any:
    """`x` with every NaN (an undefined correlation) as None: the file stays strict JSON (null)."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_null(v) for v in x]
    return x


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        print("error: give STORE_DIR OUT_JSON FILE... (OUT_JSON: where the breakdown is written)", file=sys.stderr)
        return 2
    out_path = argv[1]
    index, files = store_and_files(__doc__, [argv[0]] + argv[2:])
    rows, skipped = [], []
    for where, record in stored_records_of(files):
        if record.get("config", {}).get("modes") and "locality" not in record["config"]["modes"]:
            continue
        scored = {r["mode"]: r for r in repredict(record, index)}
        cfg = record["config"]
        for row in record["rows"]:
            if row["mode"] != "locality":
                continue
            b = breakdown(row, scored["locality"]["repredicted_s"])
            if b is None:
                skipped.append(where)
                continue
            b.update(where=where, family=family(where), load=(record.get("load_average") or [None])[0],
                     config=dict(rate_mbit=cfg["store_rate_bps"] / 1e6, batch=cfg["batch_size"],
                                 cache_share=cfg["cache_share"], prefetch_factor=cfg.get("prefetch_factor"),
                                 loader_workers=cfg.get("loader_workers")))
            rows.append(b)
    groups: dict[str, list] = {}
    for b in rows:
        c = b["config"]
        groups.setdefault(f"{c['rate_mbit']:g} Mbit/s batch {c['batch']} cache {c['cache_share']:g} / {b['family']}", []).append(b)
    summary = {}
    for name, members in sorted(groups.items()):
        summary[name] = dict(runs=len(members), error=interval([b["error"] for b in members]),
                             within_15=sum(abs(b["error"]) <= 0.15 for b in members),
                             shares={k: interval([b["shares"][k] for b in members]) for k in TERMS},
                             terms_ms={k: interval([b["terms_s"][k] * 1e3 for b in members]) for k in TERMS})
    errors = [b["error"] for b in rows]
    correlations = {k: correlation_or_nan([b["shares"][k] for b in rows], errors) for k in TERMS}
    full = [b for b in rows if b["config"]["cache_share"] == 1.0]
    full_correlations = {k: correlation_or_nan([b["shares"][k] for b in full], [b["error"] for b in full])
                         for k in TERMS}
    ranked = [(b, one) for b in full for one in b["other_ranks"] or [] if one["rank"] == 1]
    rank1 = dict(rows=len(ranked),
                 rank0_all_reduce_ms=interval([b["terms_s"]["all_reduce"] * 1e3 for b, _ in ranked]),
                 rank0_wait_ms=interval([b["terms_s"]["wait"] * 1e3 for b, _ in ranked]),
                 rank1_wait_ms=interval([one["wait"] * 1e3 for _, one in ranked]),
                 rank1_all_reduce_ms=interval([one["all_reduce"] * 1e3 for _, one in ranked]),
                 r_rank0_all_reduce_rank1_wait=correlation_or_nan(
                     [b["terms_s"]["all_reduce"] for b, _ in ranked], [one["wait"] for _, one in ranked]),
                 r_rank0_all_reduce_rank1_all_reduce=correlation_or_nan(
                     [b["terms_s"]["all_reduce"] for b, _ in ranked], [one["all_reduce"] for _, one in ranked]))
    if len(ranked) >= 2:  # the rule fixed before the fresh runs (docs/data.md): same sign in mean and r >= 0.5
        rank1["rule_other_ranks_wait_met"] = bool(
            rank1["rank0_all_reduce_ms"][0] * rank1["rank1_wait_ms"][0] > 0 and rank1["r_rank0_all_reduce_rank1_wait"] >= 0.5)
    overall = dict(rows=len(rows), under_predicted=sum(e < 0 for e in errors),
                   within_15=sum(abs(e) <= 0.15 for e in errors),
                   shares={k: interval([b["shares"][k] for b in rows]) for k in TERMS},
                   full_cache_shares={k: interval([b["shares"][k] for b in full]) for k in TERMS},
                   correlation_with_error=correlations, full_cache_correlation_with_error=full_correlations,
                   full_cache_steps_past_start_gap_ms=interval(
                       [(b["calibration"]["step_s_median"] - b["measured"]["steps_past_start_s"]) * 1e3
                        for b in full if b["measured"]["steps_past_start_s"] is not None]),
                   full_cache_other_ranks=rank1,
                   remote_bytes_steady_full_cache=sorted({b["data"]["remote_bytes"] for b in full}),
                   hit_rate_full_cache=sorted({b["data"]["hit_rate"] for b in full}))
    for name, s in summary.items():
        e = s["error"]
        print(f"{name}: {s['runs']} runs, error {e[0] if e else errors[0]:+.1%}"
              + (f" ({e[1]:+.1%}..{e[2]:+.1%})" if e else "") + f", within 15% {s['within_15']}")
        print("    ms: " + ", ".join(f"{k} {v[0]:+.2f}" if v else f"{k} -" for k, v in s["terms_ms"].items()))
    print(f"all {overall['rows']} locality rows: under-predicted {overall['under_predicted']}, within 15% {overall['within_15']}")
    def shown(i: list[float] | None) -> str:  # an interval, or "-" with fewer than two rows
        return f"{i[0]:+.2%} ({i[1]:+.2%}..{i[2]:+.2%})" if i else "-"

    for k in TERMS:
        print(f"  {k:<12} share of the step {shown(overall['shares'][k])}; full cache "
              f"{shown(overall['full_cache_shares'][k])}; r with the error {correlations[k]:+.2f} (full cache "
              f"{full_correlations[k]:+.2f})")
    gap = overall["full_cache_steps_past_start_gap_ms"]
    if gap:
        print(f"  full cache, steps past each epoch's first two: calibrations' median less them {gap[0]:+.2f} ms "
              f"({gap[1]:+.2f}..{gap[2]:+.2f})")
    if ranked:
        print(f"  full cache, {len(ranked)} rows keeping every rank: " + ", ".join(
            f"{k} {v[0]:+.2f} ms ({v[1]:+.2f}..{v[2]:+.2f})" if isinstance(v, list)
            else f"{k} {v:+.2f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in rank1.items() if k != "rows"))
    with open(out_path, "w") as f:
        json.dump(_nan_to_null(dict(kind=KIND, command="python -m experiments.data_locality_breakdown " + " ".join(argv),
                                    files=files, skipped_without_calibration=skipped, overall=overall,
                                    groups=summary, rows=rows)),
                  f, indent=1, sort_keys=False, allow_nan=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
