"""Issue 28's hierarchical validation, from bench runs with several ranks per host: every row's
measured step, hierarchical ps against flat ps and ddp, E and S, and the simulator's errors.

For each configuration of the given bench JSONs (`caramel bench --nproc-per-node K`, saved
prediction inputs): each row's median step and rounds; the speed-up of `ps:hierarchical=true`
over flat `ps` and over `ddp` (median over median, 95% interval from the paired rounds,
`caramel.stats.paired_rounds_interval`); TicTac's E (median) and S of the ps rows; each row's
error as predicted in the job and, for the ps rows, as `experiments/ps_sim_score.py` replays it
from the saved inputs (the two must agree); and, for the hierarchical rows, the model's step in
terms (its pull phase, compute and push phase, `experiments/ps_sim_bsp_terms.py`) and the step
with one input changed (the within-host rate at the link's, no compute slowdown, no latency).
Nothing is fitted: it reads and replays.

    PYTHONPATH=. python experiments/ps_hier_validation.py RUN/hosts2x2.json [RUN/hosts3x2.json] \
        --out docs/results/ps_hier_validation.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys

from caramel.stats import paired_rounds_interval

FORMAT = "caramel.ps_hier_validation/1"
HIER = "ps:hierarchical=true"


def speedup(rows: dict, ref: str, cand: str) -> dict | None:
    """median(ref) / median(cand), with the paired rounds' 95% interval."""
    if ref not in rows or cand not in rows:
        return None
    a, b = rows[ref], rows[cand]
    point = a["step_time_median_s"] / b["step_time_median_s"]
    ci = paired_rounds_interval(a["round_medians_s"] or [], b["round_medians_s"] or [], point)
    return {"point": point, "interval_95": list(ci) if ci else None, "rounds": len(a["round_medians_s"] or [])}


def one_input_changed(pi: dict, strategy: str) -> dict:
    """The row's prediction with one recorded input changed at a time (seconds)."""
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict
    from caramel.topology.spec import ClusterSpec

    prof = ModelProfile.from_dict(pi["profile"])
    base = pi["clusters"]["base"]
    cases = {"recorded inputs": lambda c: None,
             "within-host rate at the link's (no node probe)": lambda c: c["meta"].pop("node_bandwidth_bps", None),
             "compute_slowdown 1": lambda c: c.update(compute_slowdown=1.0),
             "latency 0": lambda c: c.update(latency_s=0.0),
             "push/pull efficiency 1": lambda c: [c["meta"].pop(k, None) for k in ("push_efficiency", "pull_efficiency")]}
    out = {}
    for name, change in cases.items():
        cd = copy.deepcopy(base)
        change(cd)
        (p,) = predict(prof, ClusterSpec.from_dict(cd), [strategy])
        out[name] = p.step_time_s
    return out


def analyse(path: str) -> list[dict]:
    from experiments.ps_sim_bsp_terms import bench_terms
    from experiments.ps_sim_score import score

    with open(path) as f:
        d = json.load(f)
    inputs = (d.get("meta") or {}).get("prediction_inputs")
    if not inputs:
        raise SystemExit(f"ps_hier_validation: {path} has no meta.prediction_inputs (nothing to replay)")
    replayed = {(r["config"], r["strategy"]): r for r in score([path], [])}
    terms = {(t["config"], t["strategy"]): t for t in bench_terms(d)}
    out = []
    for label, pi in inputs.items():
        from caramel.bench.record import Record, config_label

        fields = set(Record.__dataclass_fields__)
        rows = {r["strategy"]: r for r in d["records"]
                if config_label(Record(**{k: v for k, v in r.items() if k in fields})) == label}
        meta = pi["clusters"]["base"]["meta"]
        conf = {"run": path, "config": label, "workers_per_node": meta.get("workers_per_node", 1),
                "node_bandwidth_bps": meta.get("node_bandwidth_bps"),
                "link_bandwidth_bps": pi["clusters"]["base"]["bandwidth_bps"],
                "compute_slowdown": pi["clusters"]["base"].get("compute_slowdown"),
                "load_average": next(iter(rows.values())).get("load_average"),
                "speedups": {f"{HIER} over {ref}": speedup(rows, ref, HIER) for ref in ("ps", "ddp")},
                "rows": []}
        for name, r in rows.items():
            rep = replayed.get((label, name))
            row = {"strategy": name, "measured_s": r["step_time_median_s"], "round_medians_s": r["round_medians_s"],
                   "compute_s": r["compute_s"], "predicted_s": r.get("predicted_step_s"),
                   "error": r.get("prediction_error"), "replayed_error": rep["error"] if rep else None,
                   "E_median": (r.get("ps") or {}).get("E_median"), "S": (r.get("ps") or {}).get("S"),
                   "predicted_E": (r.get("ps") or {}).get("predicted_E")}
            if name.startswith("ps") and "hierarchical=true" in name:
                t = terms.get((label, name))
                row["model_terms_s"] = {k: t[k] for k in ("pull_phase", "push_phase", "model_compute")} if t else None
                row["one_input_changed_s"] = one_input_changed(pi, name)
            conf["rows"].append(row)
        out.append(conf)
    return out


def markdown(confs: list[dict]) -> str:
    pct = lambda e: "-" if e is None else f"{100 * e:+.1f}%"  # noqa: E731
    ms = lambda s: "-" if s is None else f"{1e3 * s:.1f}"  # noqa: E731
    lines = []
    for c in confs:
        lines += [f"### {c['config']}", "",
                  f"Link {c['link_bandwidth_bps'] / 1e6:.1f} Mbit/s achieved (comm-only baseline), within a host "
                  f"{(c['node_bandwidth_bps'] or 0) / 1e9:.2f} Gbit/s (node probe), compute slowdown beside "
                  f"transfers {c['compute_slowdown']:.2f}, 1-minute load at the end {c['load_average']:.1f}.", "",
                  "| strategy | measured ms | rounds (ms) | predicted ms | error | replayed error | E | S |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in c["rows"]:
            e = "-" if r["E_median"] is None else f"{r['E_median']:.2f}"
            s = "-" if r["S"] is None else f"{r['S']:.2f}"
            rounds = ", ".join(f"{1e3 * x:.0f}" for x in r["round_medians_s"] or [])
            lines.append(f"| {r['strategy']} | {ms(r['measured_s'])} | {rounds} | {ms(r['predicted_s'])} | "
                         f"{pct(r['error'])} | {pct(r['replayed_error'])} | {e} | {s} |")
        lines.append("")
        for name, sp in c["speedups"].items():
            if sp:
                ci = sp["interval_95"]
                lines.append(f"- {name}: **{sp['point']:.3f}x**" + (f" ({ci[0]:.3f}-{ci[1]:.3f}, {sp['rounds']} paired rounds)"
                                                                 if ci else " (no interval: under 3 rounds)"))
        for r in c["rows"]:
            if r.get("one_input_changed_s"):
                t = r.get("model_terms_s") or {}
                lines.append(f"- {r['strategy']}, the model's terms (ms): pull phase {ms(t.get('pull_phase'))}, "
                             f"compute {ms(t.get('model_compute'))}, push phase {ms(t.get('push_phase'))}; "
                             "one input changed: " + "; ".join(
                                 f"{k} {ms(v)} ({pct(v / r['measured_s'] - 1)})" for k, v in r["one_input_changed_s"].items()))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench JSONs with meta.prediction_inputs")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    confs = [c for p in args.runs for c in analyse(p)]
    if args.out:
        from caramel.bench.provenance import code_version
        from caramel.jsonio import write_json

        write_json(args.out, {"format": FORMAT, "code": code_version(), "configurations": confs})
    print(markdown(confs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
