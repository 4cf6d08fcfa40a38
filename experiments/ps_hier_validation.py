"""Issue 28's hierarchical validation, from bench runs with several ranks per host: every row's
measured step, hierarchical ps against flat ps and ddp, E and S, and the simulator's errors.

For each configuration of the given bench JSONs (`caramel bench --nproc-per-node K`, saved
prediction inputs): each row's median step and rounds; the speed-up of `ps:hierarchical=true`
over flat `ps` and over `ddp` (median over median, 95% interval from the paired rounds,
`caramel.stats.paired_rounds_interval`); TicTac's E (median) and S of the ps rows, E printed
only where it means something (`caramel.strategies.ps.tictac.e_reading`), with (m - U) / L; each row's
error as predicted in the job and, for the ps rows, as `experiments/ps_sim_score.py` replays it
from the saved inputs (the two must agree); and, for the hierarchical rows, the model's step in
terms (its pull phase, compute and push phase, `experiments/ps_sim_bsp_terms.py`) and the step
with one input changed (the within-host rate at the link's or 2, 4, 8 times lower, no compute
slowdown, no latency, no flat-ps traffic efficiencies).
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

FORMAT = "caramel.ps_hier_validation/2"  # 2: E readings, (m - U) / L, node-rate cases
HIER = "ps:hierarchical=true"


def speedup(rows: dict, ref: str, cand: str) -> dict | None:
    """median(ref) / median(cand), with the paired rounds' 95% interval."""
    if ref not in rows or cand not in rows:
        return None
    a, b = rows[ref], rows[cand]
    point = a["step_time_median_s"] / b["step_time_median_s"]
    ci = paired_rounds_interval(a["round_medians_s"] or [], b["round_medians_s"] or [], point)
    paired = min(len(a["round_medians_s"] or []), len(b["round_medians_s"] or []))  # what the interval pairs
    return {"point": point, "interval_95": list(ci) if ci else None, "rounds": paired}


def tac_reading(ps: dict | None) -> dict:
    """A ps row's E as a number only where it means something (`e_reading`: S >= 0.2 and E in
    [0, 1]), else why not; and (m - U) / L, the makespan beyond the no-overlap bound in units of
    L: the runtime's median where the run recorded it, else -E x S from the median E and the
    last step's S (runs before S was a median: two steps' numbers, marked approximate)."""
    from caramel.strategies.ps.tictac import e_reading

    ps = ps or {}
    E, S = ps.get("E_median"), ps.get("S")
    value, why = e_reading(E, S)
    beyond, exact = ps.get("beyond_U_over_L_median"), True
    if beyond is None and E is not None and S is not None:
        beyond, exact = -E * S, False
    return {"E": value, "E_not_meaningful": why, "beyond_U_over_L": beyond, "beyond_U_over_L_exact": exact}


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
             # the flat ps pricing's probed efficiencies: hierarchical rows do not read them
             "flat ps traffic efficiencies 1": lambda c: [c["meta"].pop(k, None) for k in (
                 "push_efficiency", "pull_efficiency", "push_efficiency_by_count")]}
    if base["meta"].get("node_bandwidth_bps"):  # how precise the node probe must be
        for div in (2, 4, 8):
            cases[f"within-host rate / {div}"] = (
                lambda c, d=div: c["meta"].update(node_bandwidth_bps=c["meta"]["node_bandwidth_bps"] / d))
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
    from caramel.bench.record import Record, config_label

    fields = set(Record.__dataclass_fields__)
    by_label: dict[str, dict] = {label: {} for label in inputs}
    for r in d["records"]:
        by_label.setdefault(config_label(Record(**{k: v for k, v in r.items() if k in fields})), {})[r["strategy"]] = r
    for label in inputs:  # before the replay, which would fail less clearly on the same gap
        if not by_label[label]:
            raise SystemExit(f"ps_hier_validation: {path} [{label}]: prediction inputs but no records (the "
                             "configuration failed?): nothing to compare")
    replayed = {(r["config"], r["strategy"]): r for r in score([path], [])}
    terms = {(t["config"], t["strategy"]): t for t in bench_terms(d)}
    out = []
    for label, pi in inputs.items():
        rows = by_label[label]
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
                   "predicted_E": (r.get("ps") or {}).get("predicted_E"),
                   **(tac_reading(r["ps"]) if r.get("ps") else {})}
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
        node = c["node_bandwidth_bps"]
        slowdown = c["compute_slowdown"]
        lines += [f"### {c['config']}", "",
                  f"Link {c['link_bandwidth_bps'] / 1e6:.1f} Mbit/s achieved (comm-only baseline), within a host "
                  + (f"{node / 1e9:.2f} Gbit/s (node probe)" if node else "none (no node probe: the link rate used)")
                  + ", compute slowdown beside transfers "
                  + ("not recorded" if slowdown is None else f"{slowdown:.2f}")
                  + ("" if c["load_average"] is None else f", 1-minute load at the end {c['load_average']:.1f}") + ".", "",
                  "| strategy | measured ms | rounds (ms) | predicted ms | error | replayed error | E | S | (m - U) / L |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        approx = False
        for r in c["rows"]:
            e = "-" if "E" not in r else (r["E_not_meaningful"] or f"{r['E']:.2f}")
            s = "-" if r["S"] is None else f"{r['S']:.2f}"
            b = r.get("beyond_U_over_L")
            beyond = "-" if b is None else f"{b:+.2f}" + ("" if r["beyond_U_over_L_exact"] else " (approx.)")
            approx |= b is not None and not r["beyond_U_over_L_exact"]
            rounds = ", ".join(f"{1e3 * x:.0f}" for x in r["round_medians_s"] or [])
            lines.append(f"| {r['strategy']} | {ms(r['measured_s'])} | {rounds} | {ms(r['predicted_s'])} | "
                         f"{pct(r['error'])} | {pct(r['replayed_error'])} | {e} | {s} | {beyond} |")
        if approx:
            lines += ["", "(approx.): -E x S from the median E and the last step's S, the only S this run recorded."]
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
