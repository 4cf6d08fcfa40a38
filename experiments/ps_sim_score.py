"""Score the ps simulator on stored bench runs: every ps row replayed from its run's saved inputs.

A bench JSON keeps what its predictions were made from (`meta.prediction_inputs`, per
configuration). This replays every ps row of the given runs with the simulator of the checkout
on `sys.path` (run it from two checkouts to compare models) and writes one JSON of per-row
predictions and errors. `--in-sample FILE[:CONFIG]` marks rows the model was built on (looked at
while it was changed); the rest are scored out of sample. An entry that matches no given run or
configuration is an error (paths are normalized: `./a.json` is `a.json`). Hierarchical rows
(`ps:hierarchical=true`, runs with several ranks per host: `caramel bench --nproc-per-node`) replay
from the layout their run recorded in the cluster's meta (`workers_per_node`,
`node_bandwidth_bps`, `backend`); a row whose run did not record the layout or the within-host
rate is refused, naming it. Each row
says its ranks per host (`workers_per_node`, 1 for a flat run). `--compare OLD NEW
--markdown OUT` writes the table of two such files side by side, once it has checked that both
score the same rows with the same marks. Nothing is fitted.

    PYTHONPATH=. python experiments/ps_sim_score.py docs/results/ps_order_final.json \
        docs/results/ps_sim_4workers_run1/bench.json \
        --in-sample docs/results/ps_sim_4workers_run1/bench.json --out AFTER.json
    python experiments/ps_sim_score.py --compare BEFORE.json AFTER.json --markdown OUT.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

FORMAT = "caramel.ps_sim_score/1"
TARGET = 0.10  # issue 28: predicted within 10% of the measured median


def _entry(entry: str) -> tuple[str, str | None]:
    """An `--in-sample` entry, FILE or FILE:CONFIG (FILE a .json), its path normalized (`./a` is `a`)."""
    path, sep, label = entry.partition(".json:")
    if sep:
        return os.path.normpath(path + ".json"), label
    return os.path.normpath(entry), None


def score(paths: list[str], in_sample: list[str]) -> list[dict]:
    """One row per ps record of each run with saved inputs: measured, predicted, error, sample.
    Every `in_sample` entry must name a given run, or one of its configurations: one that
    matches nothing would silently turn rows the model was built on into out-of-sample ones."""
    from caramel.errors import CaramelError
    from caramel.strategies.options import parse_spec
    from experiments.ps_sim_sensitivity import ps_rows

    marks = {e: _entry(e) for e in in_sample}
    configs = []  # (run, its records, config, inputs, the entries marking it in sample)
    for path in map(os.path.normpath, paths):
        with open(path) as f:
            d = json.load(f)
        inputs = (d.get("meta") or {}).get("prediction_inputs")
        if not inputs:
            raise SystemExit(f"ps_sim_score: {path} has no meta.prediction_inputs (nothing to replay)")
        for label, pi in inputs.items():
            hits = [e for e, (p, lab) in marks.items() if p == path and lab in (None, label)]
            configs.append((path, d["records"], label, pi, hits))
    used = {e for *_, hits in configs for e in hits}
    unused = [e for e in in_sample if e not in used]
    if unused:  # checked before the (slow) replays
        raise SystemExit("ps_sim_score: --in-sample entries matching no given run or configuration (FILE or "
                         "FILE:CONFIG, CONFIG a key of the run's meta.prediction_inputs): " + ", ".join(map(repr, unused)))
    rows = []
    for path, records, label, pi, hits in configs:
        try:
            replayed = ps_rows(records, label, pi)
        except CaramelError as e:  # e.g. a hierarchical row from a run that recorded no layout
            raise SystemExit(f"ps_sim_score: {path} [{label}]: cannot replay its ps rows: {e}") from None
        meta = pi["clusters"]["base"].get("meta") or {}
        local = meta.get("workers_per_node", 1)
        for r, e in replayed:
            if parse_spec(r["strategy"])[1].get("hierarchical") is True and local > 1 and not meta.get("node_bandwidth_bps"):
                # the simulator would price the node stage at the link's rate, ~80x too slow on the bench
                raise SystemExit(f"ps_sim_score: {path} [{label}] {r['strategy']}: no node probe "
                                 "(meta.node_bandwidth_bps): the within-host rate is unknown; not scored")
            rows.append({"run": path, "config": label, "strategy": r["strategy"], "workers_per_node": local,
                         "measured_s": r["step_time_median_s"], "predicted_s": r["step_time_median_s"] * (1 + e),
                         "error": e, "recorded_error": r.get("prediction_error"),
                         "sample": "in" if hits else "out"})
    return rows


def summary(rows: list[dict]) -> str:
    errs = [abs(r["error"]) for r in rows]
    if not errs:
        return "-"
    within = sum(e <= TARGET for e in errs)
    return f"{within} of {len(errs)} within 10%, median abs. error {100 * statistics.median(errs):.1f}%, largest {100 * max(errs):.1f}%"


def check_comparable(old: dict, new: dict) -> None:
    """Two --out files can be set side by side only if they score the same rows, marked alike."""
    for name, d in (("OLD", old), ("NEW", new)):
        if d.get("format") != FORMAT:
            raise SystemExit(f"ps_sim_score: --compare {name} has format {d.get('format')!r}, expected {FORMAT!r} "
                             "(a file written by --out)")
    marks = lambda d: sorted((p, lab or "") for p, lab in map(_entry, d["in_sample"]))  # noqa: E731
    if marks(old) != marks(new):
        raise SystemExit(f"ps_sim_score: --compare OLD and NEW were marked differently: --in-sample "
                         f"{old['in_sample']} against {new['in_sample']}")
    key = lambda r: (r["run"], r["config"], r["strategy"], r["sample"])  # noqa: E731
    a, b = sorted(map(key, old["rows"])), sorted(map(key, new["rows"]))
    if a != b:
        diff = sorted(set(a) ^ set(b)) or ["(the same rows, counted differently)"]
        raise SystemExit(f"ps_sim_score: --compare OLD and NEW score different rows (run, config, strategy, "
                         f"sample), e.g. {diff[:3]}")


def compare(old: dict, new: dict) -> str:
    check_comparable(old, new)
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
    for s, name in (("in", "built on (in sample)"), ("out", "not built on (out of sample)")):
        print(f"{name}: {summary([r for r in rows if r['sample'] == s])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
