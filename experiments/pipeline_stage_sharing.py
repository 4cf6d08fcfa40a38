"""Every stored pipeline row scored under both host-sharing models: one factor per layout, one per stage.

For each bench run directory (`bench.json` and `trace/<config>/` with `prediction_inputs.json`
and the pipelines' action timings, as `caramel bench --trace` writes them), each pipeline row is
replayed from the run's saved inputs with the layout its runtime ran
(`pipeline_stage_busy.replay_run`) twice: with the spec's `sharing_model="layout"` (what every
stored run was predicted with) and `"stage"` (`caramel.strategies.pipeline.sharing`). Set
beside the measurement: the step (against the measured median) and each stage's busy time as
the runtime's timer counts it (against the mean over the stage's ranks of each rank's median per
step), with each lane's sharing factor. A run without host sharing (its profile not taken in
turns, or one rank per host) has nothing for either model to spread and is refused by name.

With `--recommend`, every row of each run (data parallelism's too) is predicted again under each
model as the bench predicts it (`predict_saved_inputs.predict_run`: `replicas="auto"` chooses
its layout again) and the run's recommendation, the fastest predicted row, is set against the
measured fastest: a hit within 5% (every row of these runs trains DDP's parameters).

Rows are marked as built on (`--built-on`: the runs whose traces were read while the model was
made) or not, and summarised apart, so that the accuracy claimed is the second group's.

    PYTHONPATH=. python experiments/pipeline_stage_sharing.py docs/results/pipeline_profile_turns/run_{l,m,o,p,q,r,s,t,n,n2} \\
        docs/results/pipeline_stage_sharing/run_u --built-on run_l,run_m,run_o,run_p,run_q,run_r --recommend \\
        --json docs/results/pipeline_stage_sharing/replay.json --markdown docs/results/pipeline_stage_sharing/replay.md
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

MODELS = ("layout", "stage")
WITHIN = 0.10


def _sharing(run: str) -> dict[str, Any] | None:
    """The host sharing `run`'s profile measured, or None (no turns, or a host per rank). A run
    scored here has one configuration: any other count of saved inputs is refused as such."""
    import glob
    import json

    paths = sorted(glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json")))
    if len(paths) != 1:
        raise SystemExit(f"{run}: expected one trace configuration (trace/*/prediction_inputs.json, from `caramel "
                         f"bench --trace DIR`), found {len(paths)}")
    with open(paths[0]) as f:
        shared = (json.load(f)["profile"].get("meta") or {}).get("host_sharing") or {}
    return shared if int(shared.get("ranks_per_host", 1)) > 1 else None


def action_excess(stages: list[dict[str, Any]], cores: float) -> list[dict[str, Any]]:
    """Per stage, each action's measured time over the profile's cost (alone, in turns) divided by
    what processor sharing over `cores` cores gives at the load it ran under, max(1, load / cores):
    1 where the action ran as fast as sharing allows. The actions the replicas' reduction touches
    (a step's first forward, which waits for and applies the previous step's buckets, and its
    last backward, which issues them) apart from the others."""
    out = []
    for st in stages:
        m = 1 + max(int(a["action"][1:]) for a in st["actions"])
        ex = {a["action"]: a["slowdown"] / max(1.0, a["ranks_at_once"] / cores) for a in st["actions"]}
        others = [v for k, v in ex.items() if k not in ("F0", f"B{m - 1}")]
        mean = statistics.mean(others) if others else None
        last = next((a for a in st["actions"] if a["action"] == f"B{m - 1}"), None)
        out.append({"stage": st["stage"], "first_forward": ex.get("F0"), "last_backward": ex.get(f"B{m - 1}"),
                    "others_mean": mean,
                    # the last backward's time beyond its excess at the others' mean: what it costs more
                    "last_backward_extra_ms": None if last is None or mean is None
                    else last["measured_ms"] * (1 - mean / ex[f"B{m - 1}"])})
    return out


def score_run(run: str) -> list[dict[str, Any]]:
    """`run`'s pipeline rows under each model: step and per-stage timed busy time, with errors."""
    from pipeline_stage_busy import replay_run

    shared = _sharing(run)
    if shared is None:
        raise SystemExit(f"{run}: its profile measured no host sharing (no 'host_sharing' with ranks_per_host > 1); "
                         "both models predict it alike, nothing to score")
    replays = {m: replay_run(run, sharing_model=m) for m in MODELS}
    rows = []
    for i, base in enumerate(replays["layout"]["rows"]):
        row = {"run": os.path.basename(os.path.normpath(run)), "strategy": base["strategy"], "layout": base["layout"],
               "measured_s": base["measured_s"], "measured_busy_s_per_stage": base["measured_busy_s_per_stage"],
               "action_excess": action_excess(base["stages"], shared["ranks_per_host"] / shared["alone_speedup"])}
        for m in MODELS:
            r = replays[m]["rows"][i]
            assert r["strategy"] == base["strategy"]
            timed = r["simulated_timed_s_per_lane"]
            equal = r["busy_errors"] is not None  # per-stage busy is scored on equal layouts (a lane per stage)
            row[m] = {"predicted_s": r["predicted_s"], "error": r["error"],
                      "timed_busy_s_per_lane": timed,
                      "busy_errors": [p / q - 1 for p, q in zip(timed, base["measured_busy_s_per_stage"])] if equal else None,
                      "factor": r["sharing"].get("factor"), "ranks_at_once": r["sharing"].get("ranks_at_once"),
                      "settled": r["sharing"].get("settled"), "passes": r["sharing"].get("passes")}
        rows.append(row)
    return rows


def recommendations(run: str) -> dict[str, dict[str, Any]]:
    """Per model, `run`'s recommendation (the fastest predicted of its rows) against its measured
    fastest: how much slower the pick measured, a hit within 5%."""
    from predict_saved_inputs import predict_run

    out = {}
    for m in MODELS:
        rows = [r for r in predict_run(run, m) if r["predicted_s"] and r["measured_s"]]
        pick = min(rows, key=lambda r: r["predicted_s"])
        fastest = min(rows, key=lambda r: r["measured_s"])
        off = pick["measured_s"] / fastest["measured_s"] - 1
        out[m] = {"recommended": pick["strategy"], "predicted_s": pick["predicted_s"], "measured_s": pick["measured_s"],
                  "fastest": fastest["strategy"], "fastest_s": fastest["measured_s"], "off": off, "hit": off <= 0.05}
    return out


def summary(rows: list[dict[str, Any]], models: tuple[str, ...] = MODELS) -> dict[str, dict[str, Any]]:
    """Per model (of `models`, the rows' keys): the steps' and the stages' median |error|,
    largest, and how many within 10% (also `pipeline_reduce_cpu`'s)."""
    out = {}
    for m in models:
        steps = [abs(r[m]["error"]) for r in rows]
        stages = [abs(e) for r in rows for e in (r[m]["busy_errors"] or [])]
        out[m] = {k: {"n": len(v), "median_abs": statistics.median(v) if v else None, "max_abs": max(v, default=None),
                      "within_10pct": sum(e <= WITHIN for e in v)} for k, v in (("step", steps), ("stage_busy", stages))}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _ms(xs) -> str:
    return "[" + ", ".join(f"{1e3 * x:.1f}" for x in xs) + "]" if xs else "-"


def _factor(f) -> str:
    return f"{f:.2f}" if isinstance(f, (int, float)) else "[" + ", ".join(f"{x:.2f}" for x in dict.fromkeys(f)) + "]"


def markdown(rows: list[dict[str, Any]], groups: dict[str, dict], command: str, code: str,
             picks: dict[str, dict] | None = None) -> str:
    out = ["# Pipeline rows under one sharing factor per layout and one per stage", "", f"Code {code}; `{command}`", "",
           "| run | built on | strategy (layout run) | measured | layout model | stage model | busy per stage measured "
           "| layout model (timer's view) | stage model | factor layout -> per stage |",
           "|---|---|---|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        lay, st = r["layout"], r["stage"]
        out.append(f"| {r['run']} | {'yes' if r['built_on'] else 'no'} | `{r['strategy']}` | {1e3 * r['measured_s']:.1f} | "
                   f"{1e3 * lay['predicted_s']:.1f} ({_pct(lay['error'])}) | {1e3 * st['predicted_s']:.1f} "
                   f"({_pct(st['error'])}) | {_ms(r['measured_busy_s_per_stage'])} | {_ms(lay['timed_busy_s_per_lane'])} "
                   f"| {_ms(st['timed_busy_s_per_lane'])} | {_factor(lay['factor'])} -> {_factor(st['factor'])} |")
    out += ["", "| rows | model | steps: median abs error | largest | within 10% | stage busy: median abs error | largest "
                "| within 10% |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for g, by_model in groups.items():
        for m, s in by_model.items():
            a, b = s["step"], s["stage_busy"]
            out.append(f"| {g} | {m} | {_pct(a['median_abs'])} | {_pct(a['max_abs'])} | {a['within_10pct']} of {a['n']} "
                       f"| {_pct(b['median_abs'])} | {_pct(b['max_abs'])} | {b['within_10pct']} of {b['n']} |")
    if picks:
        out += ["", "| run | measured fastest | layout model recommends (measured, off) | stage model recommends |",
                "|---|---|---|---|"]
        for run, by in picks.items():
            cell = {m: f"`{p['recommended']}` ({1e3 * p['measured_s']:.1f} ms, {100 * p['off']:+.1f}%: "
                       f"{'hit' if p['hit'] else 'miss'})" for m, p in by.items()}
            out.append(f"| {run} | `{by['layout']['fastest']}` ({1e3 * by['layout']['fastest_s']:.1f} ms) | "
                       f"{cell['layout']} | {cell['stage']} |")
    out += ["", "Per action, measured time over the profile's cost (alone) divided by processor sharing's at the load "
                "it ran under (1: as fast as sharing allows): the step's first forward (F0) and last backward (B last), "
                "which the replicas' reduction touches, against the mean of the stage's other actions, and the last "
                "backward's time beyond the others' mean.", "",
            "| run | strategy | stage | F0 | B last | others (mean) | B last beyond, ms |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        for a in r["action_excess"]:
            extra = a["last_backward_extra_ms"]
            cells = " | ".join("-" if a[k] is None else f"{a[k]:.2f}" for k in ("first_forward", "last_backward", "others_mean"))
            out.append(f"| {r['run']} | `{r['strategy']}` | {a['stage']} | {cells} | {'-' if extra is None else f'{extra:.1f}'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    from caramel.bench.provenance import code_version
    from caramel.jsonio import write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench run directories (bench.json, trace/) whose profile measured host sharing")
    ap.add_argument("--built-on", default="", help="comma-separated run directory names read while the model was made")
    ap.add_argument("--recommend", action="store_true",
                    help="also each run's recommendation under each model against its measured fastest")
    ap.add_argument("--json", help="write the rows and summaries here")
    ap.add_argument("--markdown", help="write the tables here")
    args = ap.parse_args(argv)
    names = [os.path.basename(os.path.normpath(r)) for r in args.runs]
    built = [b for b in args.built_on.split(",") if b]
    unknown = [b for b in built if b not in names]
    if unknown:
        raise SystemExit(f"--built-on {unknown[0]!r} names no run given; expected among {', '.join(names)}")
    rows = []
    for run in args.runs:
        for r in score_run(run):
            r["built_on"] = r["run"] in built
            rows.append(r)
            print(f"{r['run']}: {r['strategy']}: measured {1e3 * r['measured_s']:.1f} ms; layout "
                  f"{1e3 * r['layout']['predicted_s']:.1f} ({_pct(r['layout']['error'])}), stage "
                  f"{1e3 * r['stage']['predicted_s']:.1f} ({_pct(r['stage']['error'])}); busy measured "
                  f"{_ms(r['measured_busy_s_per_stage'])}, layout {_ms(r['layout']['timed_busy_s_per_lane'])}, stage "
                  f"{_ms(r['stage']['timed_busy_s_per_lane'])}", flush=True)
    picks = {}
    if args.recommend:
        for run in args.runs:
            name = os.path.basename(os.path.normpath(run))
            picks[name] = recommendations(run)
            print(f"{name}: " + "; ".join(f"{m} recommends {p['recommended']} ({100 * p['off']:+.1f}% off the measured "
                                          f"fastest {p['fastest']})" for m, p in picks[name].items()), flush=True)
    unsettled = [f"{r['run']} {r['strategy']} ({m})" for r in rows for m in MODELS if r[m]["settled"] is False]
    print(f"sharing passes unsettled: {len(unsettled)} of {len(rows) * len(MODELS)}" + (f": {unsettled}" if unsettled else ""))
    groups = {"built on": summary([r for r in rows if r["built_on"]]),
              "not built on": summary([r for r in rows if not r["built_on"]]), "all": summary(rows)}
    code = code_version()
    command = "PYTHONPATH=. python experiments/pipeline_stage_sharing.py " + " ".join(argv)
    for g, by_model in groups.items():
        for m, s in by_model.items():
            print(f"{g}, {m}: steps median |error| {_pct(s['step']['median_abs'])}, {s['step']['within_10pct']} of "
                  f"{s['step']['n']} within 10%; stage busy {_pct(s['stage_busy']['median_abs'])}, "
                  f"{s['stage_busy']['within_10pct']} of {s['stage_busy']['n']} within 10%")
    if args.json:
        write_json(args.json, {"format": "caramel.experiments.pipeline_stage_sharing/1", "code": code, "command": command, "rows": rows,
                               "summary": groups, "recommendations": picks, "unsettled": unsettled})
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, groups, command, code, picks)
                    + f"\nSharing passes ended unsettled: {len(unsettled)} of {len(rows) * len(MODELS)} replays"
                    + (f" ({', '.join(unsettled)})" if unsettled else "") + ".\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
