"""Every stored pipeline row scored with the replicas' buckets per layer and from Caramel's planner.

The spec's `reduce_buckets="planner"` reduces each replicated stage in the buckets, chunks and
order Caramel's planner makes for it, as the runtime's engine plans them
(`caramel.strategies.pipeline.planner_buckets`; docs/results/pipeline_planner_buckets/README.md
has the rule, written before run W). Each pipeline row of each run is replayed with the layout its
runtime ran (`pipeline_stage_busy.replay_run`) under four models: buckets "layers" (every stored
prediction) or "planner", each with `reduce_cpu` "none" or "messages"; beside the measurement: the
step (against the measured median) and each stage's busy time as the runtime's timer counts it.
Where the trace holds the engine's plan (`reduce_plan`, runs V on), each stage's bucket count
under both bucket models beside the engine's.

    PYTHONPATH=. python experiments/pipeline_planner_buckets.py docs/results/pipeline_profile_turns/run_{l,m,o,p,q,r,s,t,n,n2} \\
        docs/results/pipeline_stage_sharing/run_u docs/results/pipeline_reduce_cpu/run_v \\
        --group stored=run_l,...,run_v --json OUT.json --markdown OUT.md
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

MODELS = {"layers": ("layers", "none"), "planner": ("planner", "none"),
          "layers+messages": ("layers", "messages"), "planner+messages": ("planner", "messages")}
WITHIN = 0.10


def score_run(run: str, only: list[str] | None = None, models: tuple[str, ...] = tuple(MODELS)) -> list[dict[str, Any]]:
    """`run`'s pipeline rows under each of `models` (the first is the base: "layers" in every
    summary), beside the measurement and the engine's buckets."""
    from pipeline_reduce_cpu import engine_buckets
    from pipeline_stage_busy import replay_run

    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise SystemExit(f"models: {unknown[0] if unknown else 'none'!r} given; expected some of {', '.join(MODELS)}")
    inputs = glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json"))
    if not inputs:
        raise SystemExit(f"{run}: no trace/*/prediction_inputs.json")
    trace_dir = os.path.dirname(inputs[0])
    replays = {m: replay_run(run, only, reduce_cpu=MODELS[m][1], reduce_buckets=MODELS[m][0]) for m in models}
    rows = []
    for i, base in enumerate(replays[models[0]]["rows"]):
        engine = engine_buckets(trace_dir, base["strategy"])
        row = {"run": os.path.basename(os.path.normpath(run)), "strategy": base["strategy"], "layout": base["layout"],
               "measured_s": base["measured_s"], "measured_busy_s_per_stage": base["measured_busy_s_per_stage"],
               "recorded_s": base["recorded_s"],
               "engine_buckets": engine,
               # per stage, the engine's bucket counts over its ranks (None: not traced)
               "engine_buckets_per_stage": (None if engine is None else
                                            [sorted({e["buckets"] for e in engine if e["stage"] == s})
                                             for s in sorted({e["stage"] for e in engine})])}
        for m in models:
            r = replays[m]["rows"][i]
            assert r["strategy"] == base["strategy"]
            timed = r["simulated_timed_s_per_lane"]
            row[m] = {"predicted_s": r["predicted_s"], "error": r["error"], "timed_busy_s_per_lane": timed,
                      "busy_errors": ([p / q - 1 for p, q in zip(timed, base["measured_busy_s_per_stage"])]
                                      if r["busy_errors"] is not None else None),
                      "buckets_per_stage": r["buckets_per_stage"],
                      "charge_ms_per_stage": (None if r["bucket_cpu_s_per_stage"] is None
                                              else [1e3 * c for c in r["bucket_cpu_s_per_stage"]])}
        rows.append(row)
    return rows


def scored(rows: list[dict[str, Any]]) -> list[str]:
    """The models `rows` were scored under (`score_run`'s `models`), in `MODELS`' order."""
    return [m for m in MODELS if rows and m in rows[0]]


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model scored in `rows`: the steps' and the stages' median |error|, largest, and how
    many within 10%."""
    out = {}
    for m in scored(rows):
        steps = [abs(r[m]["error"]) for r in rows]
        stages = [abs(e) for r in rows for e in (r[m]["busy_errors"] or [])]
        out[m] = {k: {"n": len(v), "median_abs": statistics.median(v) if v else None, "max_abs": max(v, default=None),
                      "within_10pct": sum(e <= WITHIN for e in v)} for k, v in (("step", steps), ("stage_busy", stages))}
    return out


def bucket_match(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the traced rows' stages: how often each bucket model's count is one of the engine's."""
    out: dict[str, Any] = {}
    for m in ("layers", "planner"):
        if not rows or m not in rows[0]:
            continue
        pairs = [(sim, eng) for r in rows if r["engine_buckets_per_stage"] and r[m]["buckets_per_stage"]
                 for sim, eng in zip(r[m]["buckets_per_stage"], r["engine_buckets_per_stage"])]
        out[m] = {"stages": len(pairs), "equal": sum(sim in eng for sim, eng in pairs),
                  "abs_diff": [min(abs(sim - e) for e in eng) for sim, eng in pairs]}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _ms(xs) -> str:
    return "[" + ", ".join(f"{1e3 * x:.1f}" for x in xs) + "]" if xs else "-"


def markdown(rows: list[dict[str, Any]], groups: dict[str, dict], matches: dict[str, dict], command: str,
             code: str) -> str:
    models = scored(rows)
    out = ["# Pipeline rows with the replicas' buckets per layer and from Caramel's planner", "",
           f"Code {code}; `{command}`", "",
           "| run | strategy | measured | " + " | ".join(models) + " | busy measured | busy layers | busy planner "
           "| buckets layers / planner / engine |", "|---|---|---:|" + "---:|" * len(models) + "---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{1e3 * r[m]['predicted_s']:.1f} ({_pct(r[m]['error'])})" for m in models)
        eng = r["engine_buckets_per_stage"]
        lay, plan = r.get("layers", {}), r.get("planner", {})  # a model not scored: "-"
        buckets = (f"{lay.get('buckets_per_stage') or '-'} / {plan.get('buckets_per_stage') or '-'} / "
                   f"{eng if eng is not None else '-'}")
        out.append(f"| {r['run']} | `{r['strategy']}` | {1e3 * r['measured_s']:.1f} | {cells} | "
                   f"{_ms(r['measured_busy_s_per_stage'])} | {_ms(lay.get('timed_busy_s_per_lane'))} | "
                   f"{_ms(plan.get('timed_busy_s_per_lane'))} | {buckets} |")
    out += ["", "| rows | model | steps: median abs error | largest | within 10% | stage busy: median abs error | largest "
                "| within 10% |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for g, by_model in groups.items():
        for m, s in by_model.items():
            a, b = s["step"], s["stage_busy"]
            out.append(f"| {g} | {m} | {_pct(a['median_abs'])} | {_pct(a['max_abs'])} | {a['within_10pct']} of {a['n']} "
                       f"| {_pct(b['median_abs'])} | {_pct(b['max_abs'])} | {b['within_10pct']} of {b['n']} |")
    out += ["", "Bucket counts against the engine's (stages of traced rows): "
            + "; ".join(f"{m}: {v['equal']} of {v['stages']} equal, |difference| {v['abs_diff']}" for m, v in matches.items())]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    from caramel.bench.provenance import code_version
    from caramel.jsonio import write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench run directories (bench.json, trace/)")
    ap.add_argument("--group", action="append", default=[],
                    help="NAME=run,run: summarise these run directory names apart (repeatable)")
    ap.add_argument("--json", help="write the rows and summaries here")
    ap.add_argument("--markdown", help="write the tables here")
    args = ap.parse_args(argv)
    code = code_version()  # the code that runs, read before the replays
    from pipeline_reduce_cpu import parse_groups

    groups_of = parse_groups(args.group, args.runs)
    rows = []
    for run in args.runs:
        for r in score_run(run):
            rows.append(r)
            print(f"{r['run']}: {r['strategy']}: measured {1e3 * r['measured_s']:.1f} ms; "
                  + ", ".join(f"{m} {1e3 * r[m]['predicted_s']:.1f} ({_pct(r[m]['error'])})" for m in MODELS)
                  + f"; buckets {r['layers']['buckets_per_stage']} / {r['planner']['buckets_per_stage']} / engine "
                  f"{r['engine_buckets_per_stage']}", flush=True)
    groups = {g: summary([r for r in rows if r["run"] in members]) for g, members in groups_of.items()}
    groups["all"] = summary(rows)
    matches = bucket_match(rows)
    command = "PYTHONPATH=. python experiments/pipeline_planner_buckets.py " + " ".join(argv)
    for g, by_model in groups.items():
        for m, s in by_model.items():
            print(f"{g}, {m}: steps median |error| {_pct(s['step']['median_abs'])}, {s['step']['within_10pct']} of "
                  f"{s['step']['n']} within 10%; stage busy {_pct(s['stage_busy']['median_abs'])}, "
                  f"{s['stage_busy']['within_10pct']} of {s['stage_busy']['n']} within 10%")
    print(f"bucket counts: {matches}")
    if args.json:
        write_json(args.json, {"format": "caramel.experiments.pipeline_planner_buckets/1", "code": code,
                               "command": command, "rows": rows, "summary": groups, "bucket_match": matches})
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, groups, matches, command, code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
