"""Every stored pipeline row scored with and without the replicas' buckets' message CPU.

The spec's `reduce_cpu="messages"` charges each bucket of a replicated stage
`collective_cpu_s (r - 1) / (n - 1)` on the step's last backward (`overlap.bucket_cpu_s`;
docs/results/pipeline_reduce_cpu/README.md has the rule, written before run V). Each pipeline row
of each run is replayed with the layout its runtime ran (`pipeline_stage_busy.replay_run`) under
`reduce_cpu="none"` (every stored prediction) and `"messages"`; beside the measurement: the step
(against the measured median) and each stage's busy time as the runtime's timer counts it. Per
stage also the charge the form gives and the last backward's measured time beyond the stage's
other actions (`pipeline_stage_sharing.action_excess`), and, where the trace has them (runs from
this branch on), the engine's buckets: their count, and per step when the first was issued after
the last backward began and when the last finished after it ended.

    PYTHONPATH=. python experiments/pipeline_reduce_cpu.py docs/results/pipeline_profile_turns/run_{l,m,o,p,q,r,s,t,n,n2} \\
        docs/results/pipeline_stage_sharing/run_u docs/results/pipeline_reduce_cpu/run_v \\
        --group in-sample=run_l,run_m,run_o,run_p,run_q,run_r --group seen=run_s,run_t,run_u,run_n,run_n2 \\
        --group fresh=run_v \\
        --json docs/results/pipeline_reduce_cpu/replay.json --markdown docs/results/pipeline_reduce_cpu/replay.md
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from pipeline_stage_sharing import _ms, _pct, summary as stage_sharing_summary  # noqa: E402

MODELS = ("none", "messages")


def engine_buckets(trace_dir: str, strategy: str) -> list[dict[str, Any]] | None:
    """Per rank whose trace holds the engine's reduction (`pipeline_actions` files' `reduce_plan`):
    its stage, the plan's bucket count, collectives (a bucket's chunks) and bytes, and the medians over the steps (the first and
    the last left out: warm-up, and collectives that may have completed after the step was
    saved) of how many collectives a step issued, the first's issue after the last backward
    began and the last's completion after that backward ended (ms). None: no rank has one."""
    from caramel.bench.strategies import trace_file_stem

    out = []
    for path in sorted(glob.glob(os.path.join(trace_dir, f"pipeline_actions.{trace_file_stem(strategy)}.rank*.json"))):
        with open(path) as f:
            rec = json.load(f)
        stage = next((a[1] for st in rec["steps"] for a in st), None)
        if "reduce_plan" not in rec or stage is None:  # no engine, or no action recorded
            continue
        issued, done, counts = [], [], []
        for acts, reduces in list(zip(rec["steps"], rec["reduces"]))[1:-1]:
            backs = [a for a in acts if a[0] == "B"]
            if not backs or not reduces:
                continue
            last = max(backs, key=lambda a: a[3])
            counts.append(len(reduces))
            issued.append(1e3 * (min(r[1] for r in reduces) - last[3]))
            done.append(1e3 * (max(r[2] for r in reduces) - last[4]))
        out.append({"rank": rec["rank"], "stage": stage, "buckets": len({b for b, _, _ in rec["reduce_plan"]}),
                    "collectives_planned": len(rec["reduce_plan"]),  # a chunked bucket is several
                    "bytes": sum(b for _, _, b in rec["reduce_plan"]),
                    "per_step": statistics.median(counts) if counts else None,
                    "first_issue_after_last_backward_start_ms": statistics.median(issued) if issued else None,
                    "last_done_after_last_backward_end_ms": statistics.median(done) if done else None})
    return out or None


def score_run(run: str, only: list[str] | None = None) -> list[dict[str, Any]]:
    """`run`'s pipeline rows (`only`: those of these strategy names) under each model, beside the
    measurement, the simulator's charge and, where traced, the engine's buckets."""
    from pipeline_stage_busy import replay_run
    from pipeline_stage_sharing import _sharing, action_excess

    shared = _sharing(run)
    replays = {m: replay_run(run, only, reduce_cpu=m) for m in MODELS}
    trace_dir = os.path.dirname(glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json"))[0])
    rows = []
    for i, base in enumerate(replays["none"]["rows"]):
        charged = replays["messages"]["rows"][i]
        row = {"run": os.path.basename(os.path.normpath(run)), "strategy": base["strategy"], "layout": base["layout"],
               "measured_s": base["measured_s"], "measured_busy_s_per_stage": base["measured_busy_s_per_stage"],
               # the simulator's own buckets and charge (None: the replicas reduce after the drain, uncharged)
               "simulator_buckets_per_stage": charged["buckets_per_stage"],
               "charge_ms_per_stage": (None if charged["bucket_cpu_s_per_stage"] is None
                                       else [1e3 * c for c in charged["bucket_cpu_s_per_stage"]]),
               "action_excess": (action_excess(base["stages"], shared["ranks_per_host"] / shared["alone_speedup"])
                                 if shared else None),
               "engine_buckets": engine_buckets(trace_dir, base["strategy"])}
        for m in MODELS:
            r = replays[m]["rows"][i]
            assert r["strategy"] == base["strategy"]
            timed = r["simulated_timed_s_per_lane"]
            equal = r["busy_errors"] is not None
            row[m] = {"predicted_s": r["predicted_s"], "error": r["error"], "timed_busy_s_per_lane": timed,
                      "busy_errors": [p / q - 1 for p, q in zip(timed, base["measured_busy_s_per_stage"])]
                      if equal else None}
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model: the steps' and the stages' median |error|, largest, and how many within 10%."""
    return stage_sharing_summary(rows, MODELS)


def markdown(rows: list[dict[str, Any]], groups: dict[str, dict], command: str, code: str) -> str:
    out = ["# Pipeline rows with and without the replicas' buckets' message CPU", "", f"Code {code}; `{command}`", "",
           "| run | strategy (layout run) | measured | none | messages | busy per stage measured | none (timer's view) "
           "| messages | charge per stage, ms | last backward beyond the others, ms |",
           "|---|---|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        a, b = r["none"], r["messages"]
        charge = "-" if r["charge_ms_per_stage"] is None else "[" + ", ".join(f"{x:.1f}" for x in r["charge_ms_per_stage"]) + "]"
        extra = "-" if not r["action_excess"] else "[" + ", ".join(
            "-" if e["last_backward_extra_ms"] is None else f"{e['last_backward_extra_ms']:.1f}" for e in r["action_excess"]) + "]"
        out.append(f"| {r['run']} | `{r['strategy']}` | {1e3 * r['measured_s']:.1f} | {1e3 * a['predicted_s']:.1f} "
                   f"({_pct(a['error'])}) | {1e3 * b['predicted_s']:.1f} ({_pct(b['error'])}) | "
                   f"{_ms(r['measured_busy_s_per_stage'])} | {_ms(a['timed_busy_s_per_lane'])} | "
                   f"{_ms(b['timed_busy_s_per_lane'])} | {charge} | {extra} |")
    out += ["", "| rows | model | steps: median abs error | largest | within 10% | stage busy: median abs error | largest "
                "| within 10% |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for g, by_model in groups.items():
        for m, s in by_model.items():
            a, b = s["step"], s["stage_busy"]
            out.append(f"| {g} | {m} | {_pct(a['median_abs'])} | {_pct(a['max_abs'])} | {a['within_10pct']} of {a['n']} "
                       f"| {_pct(b['median_abs'])} | {_pct(b['max_abs'])} | {b['within_10pct']} of {b['n']} |")
    traced = [(r, e) for r in rows for e in (r["engine_buckets"] or [])]
    if traced:
        out += ["", "The engine's buckets, from the trace (medians over the steps but the first and the last):", "",
                "| run | strategy | rank | stage | buckets (plan) | bytes | per step | first issued after the last "
                "backward began, ms | last done after it ended, ms |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r, e in traced:
            cells = " | ".join("-" if e[k] is None else f"{e[k]:.1f}" for k in (
                "per_step", "first_issue_after_last_backward_start_ms", "last_done_after_last_backward_end_ms"))
            out.append(f"| {r['run']} | `{r['strategy']}` | {e['rank']} | {e['stage']} | {e['buckets']} | {e['bytes']} "
                       f"| {cells} |")
    return "\n".join(out) + "\n"



def parse_groups(groups: list[str], runs: list[str]) -> dict[str, list[str]]:
    """`--group NAME=run,run` values as {NAME: run names}, each name a given run directory's."""
    names = [os.path.basename(os.path.normpath(r)) for r in runs]
    groups_of: dict[str, list[str]] = {}
    for g in groups:
        name, sep, members = g.partition("=")
        members_of = [m for m in members.split(",") if m]
        if not sep or not name or not members_of:
            raise SystemExit(f"--group {g!r}: expected NAME=run,run")
        unknown = [m for m in members_of if m not in names]
        if unknown:
            raise SystemExit(f"--group {name}: {unknown[0]!r} names no run given; expected among {', '.join(names)}")
        groups_of[name] = members_of
    return groups_of

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
    code = code_version()  # the code that runs, read before the replays (not after: edits meanwhile)
    groups_of = parse_groups(args.group, args.runs)
    rows = []
    for run in args.runs:
        for r in score_run(run):
            rows.append(r)
            print(f"{r['run']}: {r['strategy']}: measured {1e3 * r['measured_s']:.1f} ms; none "
                  f"{1e3 * r['none']['predicted_s']:.1f} ({_pct(r['none']['error'])}), messages "
                  f"{1e3 * r['messages']['predicted_s']:.1f} ({_pct(r['messages']['error'])}); busy measured "
                  f"{_ms(r['measured_busy_s_per_stage'])}, none {_ms(r['none']['timed_busy_s_per_lane'])}, messages "
                  f"{_ms(r['messages']['timed_busy_s_per_lane'])}; charge ms {r['charge_ms_per_stage']}", flush=True)
    groups = {g: summary([r for r in rows if r["run"] in members]) for g, members in groups_of.items()}
    groups["all"] = summary(rows)
    command = "PYTHONPATH=. python experiments/pipeline_reduce_cpu.py " + " ".join(argv)
    for g, by_model in groups.items():
        for m, s in by_model.items():
            print(f"{g}, {m}: steps median |error| {_pct(s['step']['median_abs'])}, {s['step']['within_10pct']} of "
                  f"{s['step']['n']} within 10%; stage busy {_pct(s['stage_busy']['median_abs'])}, "
                  f"{s['stage_busy']['within_10pct']} of {s['stage_busy']['n']} within 10%")
    if args.json:
        write_json(args.json, {"format": "caramel.experiments.pipeline_reduce_cpu/1", "code": code, "command": command,
                               "rows": rows, "summary": groups})
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, groups, command, code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
