"""Score the ps simulator on stored bench runs: every ps row replayed from its run's saved inputs.

A bench JSON keeps what its predictions were made from (`meta.prediction_inputs`, per
configuration). This replays every ps row of the given runs with the simulator of the checkout
on `sys.path` (run it from two checkouts to compare models) and writes one JSON of per-row
predictions and errors. `--in-sample FILE[:CONFIG]` marks rows the model was built on (looked at
while it was changed); the rest are scored out of sample. `--compare OLD NEW --markdown OUT`
writes the table of two such files side by side. Nothing is fitted.

    PYTHONPATH=. python experiments/ps_sim_score.py docs/results/ps_order_final.json \
        docs/results/ps_sim_4workers_run1/bench.json --in-sample docs/results/ps_sim_4workers_run1/bench.json \
        --out /tmp/after.json
    python experiments/ps_sim_score.py --compare /tmp/before.json /tmp/after.json --markdown OUT.md
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

FORMAT = "caramel.ps_sim_score/1"
TARGET = 0.10  # issue 28: predicted within 10% of the measured median


def score(paths: list[str], in_sample: list[str]) -> list[dict]:
    """One row per ps record of each run with saved inputs: measured, predicted, error, sample."""
    from experiments.ps_sim_sensitivity import _ps_rows

    rows = []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        inputs = (d.get("meta") or {}).get("prediction_inputs")
        if not inputs:
            raise SystemExit(f"ps_sim_score: {path} has no meta.prediction_inputs (nothing to replay)")
        for label, pi in inputs.items():
            inside = path in in_sample or f"{path}:{label}" in in_sample
            for r, e in _ps_rows(d["records"], label, pi):
                rows.append({"run": path, "config": label, "strategy": r["strategy"],
                             "measured_s": r["step_time_median_s"], "predicted_s": r["step_time_median_s"] * (1 + e),
                             "error": e, "recorded_error": r.get("prediction_error"),
                             "sample": "in" if inside else "out"})
    return rows


def summary(rows: list[dict]) -> str:
    errs = [abs(r["error"]) for r in rows]
    if not errs:
        return "-"
    within = sum(e <= TARGET for e in errs)
    return f"{within} of {len(errs)} within 10%, median abs. error {100 * statistics.median(errs):.1f}%, largest {100 * max(errs):.1f}%"


def compare(old: dict, new: dict) -> str:
    key = lambda r: (r["run"], r["config"], r["strategy"])  # noqa: E731
    after = {key(r): r for r in new["rows"]}
    lines = [f"Model before: {old['code']}; after: {new['code']}.", "",
             "| sample | rows | before | after |", "|---|---:|---|---|"]
    for s, name in (("in", "built on"), ("out", "not built on")):
        a = [r for r in old["rows"] if r["sample"] == s]
        b = [after[key(r)] for r in a]
        lines.append(f"| {name} | {len(a)} | {summary(a)} | {summary(b)} |")
    lines += ["", "| run | configuration | strategy | sample | measured ms | before ms | error | after ms | error |",
              "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in old["rows"]:
        n = after[key(r)]
        lines.append(f"| {r['run'].split('docs/results/')[-1]} | {r['config']} | {r['strategy']} | {r['sample']} | "
                     f"{1e3 * r['measured_s']:.1f} | {1e3 * r['predicted_s']:.1f} | {100 * r['error']:+.1f}% | "
                     f"{1e3 * n['predicted_s']:.1f} | {100 * n['error']:+.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", help="bench JSONs with meta.prediction_inputs")
    ap.add_argument("--in-sample", action="append", default=[], metavar="FILE[:CONFIG]",
                    help="rows the model was built on (repeatable)")
    ap.add_argument("--out", help="write the per-row JSON here")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="two files written by --out")
    ap.add_argument("--markdown", help="with --compare: write the table here (else print it)")
    args = ap.parse_args(argv)
    if args.compare:
        if args.runs or args.out:
            ap.error("--compare takes no runs and no --out")
        old, new = (json.load(open(p)) for p in args.compare)
        text = compare(old, new)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(text)
        else:
            print(text, end="")
        return 0
    if not args.runs or not args.out:
        ap.error("give bench JSONs and --out (or --compare OLD NEW)")
    from caramel.bench.provenance import code_version
    from caramel.jsonio import write_json

    rows = score(args.runs, args.in_sample)
    write_json(args.out, {"format": FORMAT, "code": code_version(), "in_sample": args.in_sample, "rows": rows})
    for s in ("in", "out"):
        print(f"{s} of sample: {summary([r for r in rows if r['sample'] == s])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
