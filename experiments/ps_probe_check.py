"""Check a bench run's traffic probe per configuration: its version's fields there, its curves within budget.

Version 5 of the probe (`caramel/bench/traffic_probe.py`) times the per-count curves in one
interleaved sweep and holds them to `curve_budget_s`, recording what it did (`curve_counts`,
`curve_reps`) and what it took (`curve_s`, `probe_s`). A run on a new network is where a field
could go missing or the budget's estimate could be off, so this reads each configuration's probe
from the records (`link_fit.traffic_probe`) and reports: the version, each field present, the
curves' time against the budget, the shares the model reads (`push_efficiency_by_count`,
`pull_efficiency_by_count` in the saved prediction inputs) and the all-at-once broadcast
repetitions (sorted: the reading switches between two modes within a job). A failure (exit
status 1): a configuration with no probe, a record of it without the probe or with a different
one, a probe below version 5, or a field missing, null or empty. The budget is reported, not
enforced (it bounds an estimate). Labels come from the torch-free `caramel.bench.labels`.

    PYTHONPATH=. python experiments/ps_probe_check.py RUN/w2/bench.json RUN/w4/bench.json --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys

from caramel.bench.labels import config_label_of_dict

FORMAT = "caramel.ps_probe_check/1"
MIN_VERSION = 5
V5_FIELDS = ("curve_counts", "curve_reps", "curve_budget_s", "curve_s", "probe_s",
             "broadcasts_at_once_s", "broadcasts_at_once_reps_s", "pushes_at_once_s")


def _read_bench(path: str) -> dict:
    """The bench JSON at `path`, or one clear error naming it and what was expected."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"ps_probe_check: cannot read {path} as JSON ({e}); expected a bench JSON")
    if not isinstance(d, dict) or not isinstance(d.get("records"), list):
        raise SystemExit(f"ps_probe_check: {path} is not a bench JSON (expected an object with 'records')")
    return d


def check_run(path: str) -> list[dict]:
    """One entry per configuration of the bench JSON at `path` (records grouped by `config_label`).

    Every record is checked: each carries its job's probe, so a record without one, or with a
    probe its configuration's other records do not share, is a problem, not skipped."""
    d = _read_bench(path)
    inputs = (d.get("meta") or {}).get("prediction_inputs") or {}
    probes: dict[str, list] = {}
    for r in d["records"]:
        probes.setdefault(config_label_of_dict(r), []).append((r.get("link_fit") or {}).get("traffic_probe"))
    out = []
    for label, ps in probes.items():
        meta = (((inputs.get(label) or {}).get("clusters") or {}).get("base") or {}).get("meta") or {}
        row = {"run": path, "config": label, "problems": []}
        found = [p for p in ps if p]
        if not found:
            row["problems"].append("no traffic probe in any record (link_fit.traffic_probe)")
            out.append(row)
            continue
        p = found[0]
        if len(found) < len(ps):
            row["problems"].append(f"{len(ps) - len(found)} of {len(ps)} records have no traffic probe")
        if any(q != p for q in found):
            row["problems"].append("the records' traffic probes differ (one job, one probe expected)")
        row["version"] = p.get("version")
        if not isinstance(row["version"], int) or row["version"] < MIN_VERSION:
            row["problems"].append(f"probe version {row['version']!r}, expected >= {MIN_VERSION}")
        missing = [k for k in V5_FIELDS if p.get(k) is None or p.get(k) in ("", [], {})]  # null or empty too
        if missing:
            row["problems"].append("missing " + ", ".join(missing))
        for k in ("curve_counts", "curve_reps", "curve_budget_s", "curve_s", "probe_s", "broadcasts_at_once_s"):
            row[k] = p.get(k)
        if isinstance(p.get("curve_s"), (int, float)) and isinstance(p.get("curve_budget_s"), (int, float)):
            row["curves_within_budget"] = p["curve_s"] <= p["curve_budget_s"]
        reps = p.get("broadcasts_at_once_reps_s") or []
        row["all_at_once_reps_s"] = sorted(reps[-1]) if reps and reps[-1] else []
        row["push_efficiency_by_count"] = meta.get("push_efficiency_by_count")
        row["pull_efficiency_by_count"] = meta.get("pull_efficiency_by_count")
        out.append(row)
    return out


def render(rows: list[dict]) -> str:
    ms = lambda xs: "[" + ", ".join(f"{1e3 * x:.1f}" for x in xs) + "]"  # noqa: E731
    sh = lambda xs: "[" + ", ".join(f"{x:.2f}" for x in xs) + "]" if xs else "-"  # noqa: E731
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731  (an older probe lacks the field)
    lines = []
    for r in rows:
        lines.append(f"{r['run']} [{r['config']}]")
        if "version" in r:
            lines.append(f"  version {r['version']}; counts {r['curve_counts']} x {r['curve_reps']} reps; "
                         f"curve_s {num(r['curve_s'], '.1f')} of budget {num(r['curve_budget_s'], '.0f')} "
                         f"({ {True: 'within', False: 'OVER'}.get(r.get('curves_within_budget'), '-') }); "
                         f"probe_s {num(r['probe_s'], '.1f')}")
            lines.append(f"  broadcasts at once (ms) {ms(r['broadcasts_at_once_s'] or [])}; "
                         f"all at once, sorted {ms(r['all_at_once_reps_s'])}")
            lines.append(f"  shares: push {sh(r['push_efficiency_by_count'])}, pull {sh(r['pull_efficiency_by_count'])}")
        lines += [f"  PROBLEM: {p}" for p in r["problems"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench JSONs")
    ap.add_argument("--json", help="write the per-configuration checks here")
    args = ap.parse_args(argv)
    rows = [row for path in args.runs for row in check_run(path)]
    print(render(rows), end="")
    if args.json:
        from caramel.jsonio import write_json
        write_json(args.json, {"format": FORMAT, "rows": rows})
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
