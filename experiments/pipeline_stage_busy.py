"""Each pipeline stage's busy time: the simulator's against the runtime's timers, from a bench run's traces.

For each run directory (`bench.json` and `trace/<config>/` with `prediction_inputs.json` and the
pipelines' `pipeline_actions.*.rank*.json`, as `caramel bench --trace` writes them), every
pipeline row is simulated again from the run's saved inputs with the layout the runtime ran
(its cut, counts and microbatches given explicitly, so a chooser that now picks another layout
does not change what is compared), and set beside the measurement:

- the step: predicted against the measured median;
- compute per step by position: the partitioner's stage times the bench used to print (at the
  speeds it planned at; for `replicas="auto"` the replicas' all-reduce included), the
  simulator's compute, the simulator's compute plus the waits the runtime's timer counts
  inside its calls (`PipelineSim.timed_s`: the first forward of a step waiting for the previous
  step's buckets under Caramel's replica reduction, the last backward under DDP's), and each
  rank's measured busy time (median per step over the kept steps, the first left out, as the
  runtime's stats and the bench's busy line count it);
- per stage and action (F, B, by microbatch index): the profile's cost at the microbatch's
  samples (speed 1), the simulator's, the measured median, and the load it ran under: how many
  ranks computed at once over the action (itself included), from every rank's timed actions
  on the host's one monotonic clock.

    PYTHONPATH=. python experiments/pipeline_stage_busy.py docs/results/pipeline_profile_turns/run_{l,m,o,p,q,r} \\
        --json docs/results/pipeline_stage_busy/stage_busy.json --markdown docs/results/pipeline_stage_busy/stage_busy.md
"""
from __future__ import annotations

import argparse
import bisect
import dataclasses
import glob
import itertools
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))


def _layout_name(name: str, pipe: dict[str, Any]) -> str:
    """`name` with the layout the runtime ran (its cut, stages, replicas, microbatches) given explicitly."""
    opts = [o for o in name.split(":", 1)[1].split(",") if o not in ("replicas=auto", "stages=auto",
                                                                     "microbatches=auto", "partition=auto")]
    keys = {o.split("=", 1)[0] for o in opts}
    given = {"stages": pipe["stages"], "replicas": pipe["replicas"], "microbatches": pipe["microbatches"],
             "partition": "+".join(pipe["boundaries"])}
    return "pipeline:" + ",".join(opts + [f"{k}={v}" for k, v in given.items() if k not in keys])


class _Coverage:
    """How many of `spans`' intervals cover a time, integrated: `load(a, b)` is the number of lanes
    computing over [a, b], time-averaged, in O(log n) from sorted starts and ends with prefix sums
    (a scan of every span per action cost seconds per row). Times are taken from the first start,
    so the sums do not cancel on the clock's large values."""

    def __init__(self, spans: list[list[tuple[float, float]]]) -> None:
        own = [(x, y) for lane in spans for x, y in lane if y > x]  # an empty span covers nothing
        self.t0 = min((x for x, _ in own), default=0.0)
        self.starts = sorted(x - self.t0 for x, _ in own)
        self.ends = sorted(y - self.t0 for _, y in own)
        self.start_sums = list(itertools.accumulate(self.starts, initial=0.0))
        self.end_sums = list(itertools.accumulate(self.ends, initial=0.0))

    def _covered(self, t: float) -> float:
        """The intervals' total length before `t` (relative to `t0`)."""
        i, j = bisect.bisect_right(self.starts, t), bisect.bisect_right(self.ends, t)
        return (i * t - self.start_sums[i]) - (j * t - self.end_sums[j])

    def load(self, a: float, b: float) -> float:
        """Lanes computing over [a, b], time-averaged (the action's own lane included)."""
        return (self._covered(b - self.t0) - self._covered(a - self.t0)) / (b - a)


def _actions(trace_dir: str, name: str) -> list[list[list]]:
    from caramel.bench.strategies import trace_file_stem

    files = sorted(glob.glob(os.path.join(trace_dir, f"pipeline_actions.{trace_file_stem(name)}.rank*.json")),
                   key=lambda f: int(f.rpartition("rank")[2].split(".")[0]))
    if not files:
        raise SystemExit(f"{trace_dir}: no pipeline_actions for {name!r}; expected a run of `caramel bench --trace`")
    return [json.load(open(f))["steps"][1:] for f in files]  # the first step left out, as the timer's stats do


def _stage_of_rank(steps: list[list]) -> int:
    return next(a[1] for st in steps for a in st)


def replay_row(prof, cluster, world: int, rec: dict[str, Any], trace_dir: str) -> dict[str, Any]:
    from caramel.strategies import STRATEGIES
    from caramel.strategies.pipeline.profile_costs import costs_from_profile, profiled_cuts

    pipe = rec["pipeline"]
    name = _layout_name(rec["strategy"], pipe)
    spec = STRATEGIES.spec(name)
    last: dict[str, Any] = {}
    sim = _spied(lambda: spec.simulate(prof, cluster, world), last)
    ranks = _actions(trace_dir, rec["strategy"])
    spans = [[(a[3], a[4]) for st in steps for a in st if a[2] >= 0] for steps in ranks]
    cover = _Coverage(spans)
    # each rank's median per step, the statistic the runtime's stats and the bench's busy line report
    busy = [statistics.median(sum(a[4] - a[3] for a in st) for st in steps) for steps in ranks]
    replicas = last["replicas"]
    lanes = _lane_loads(last["sim"], cluster, replicas if isinstance(replicas, int) and replicas > 1 else 1)
    opts = spec.options
    equal = not opts.unequal_replicas
    positions = opts.stages
    names, costs = costs_from_profile(prof, opts.microbatches,
                                      batches=positions if equal else opts.workers(positions))
    edges = [0, *profiled_cuts(names, pipe["boundaries"]), len(names)]
    per_stage = []
    for s in range(len(edges) - 1):
        layers = costs[edges[s]:edges[s + 1]]
        profile_ms = {"F": 1e3 * sum(c.forward_s for c in layers), "B": 1e3 * sum(c.backward_s for c in layers)}
        rows = []
        for kind in "FB":
            for i in range(opts.microbatches if equal else max(len(opts.replica_counts()), opts.microbatches)):
                acts = [(r, a) for r, steps in enumerate(ranks) for st in steps for a in st
                        if a[0] == kind and a[1] == s and a[2] == i]
                if not acts:
                    continue
                ms = statistics.median(1e3 * (a[4] - a[3]) for _, a in acts)
                load = statistics.mean(cover.load(a[3], a[4]) for _, a in acts)
                rows.append({"action": f"{kind}{i}", "measured_ms": ms, "profile_ms": profile_ms[kind],
                             "slowdown": ms / profile_ms[kind], "ranks_at_once": load})
        per_stage.append({"stage": s, "ranks": [r for r, steps in enumerate(ranks) if _stage_of_rank(steps) == s],
                          "actions": rows, "param_layers": sum(1 for c in layers if c.param_bytes)})
    measured = rec["step_time_median_s"]
    stage_of = [_stage_of_rank(steps) for steps in ranks]
    per_stage_busy = [statistics.mean(b for b, s in zip(busy, stage_of) if s == k) for k in sorted(set(stage_of))]
    return {"busy_errors": _errors(pipe.get("predicted_busy_s_per_stage"), sim.meta["busy_s_per_lane"],
                                   sim.meta["timed_busy_s_per_lane"], per_stage_busy) if equal else None,
            "round_medians_s": rec.get("round_medians_s"), "measured_busy_s_per_stage": per_stage_busy,
            "strategy": rec["strategy"], "layout": name, "measured_s": measured, "recorded_s": rec.get("predicted_step_s"),
            "predicted_s": sim.step_time_s, "error": sim.step_time_s / measured - 1,
            "partitioner_s_per_stage": pipe.get("predicted_busy_s_per_stage"),
            "simulated_busy_s_per_lane": sim.meta["busy_s_per_lane"],
            "simulated_timed_s_per_lane": sim.meta["timed_busy_s_per_lane"],
            "measured_busy_s_per_rank": busy, "measured_busy_s_per_stage_rank0": pipe.get("busy_s_per_stage"),
            "rank_stage": [_stage_of_rank(steps) for steps in ranks],
            "sharing": {k: v for k, v in (sim.meta.get("sharing") or {}).items()
                        if k in ("factor", "ranks_at_once", "settled", "passes")},
            "measured_ranks_at_once": _co(spans), "simulated_load_per_lane": lanes,
            "measured_ranks_at_once_per_rank": [_own(spans, cover, r) for r in range(len(spans))], "stages": per_stage,
            # the simulator's buckets per stage and their charge on the last backward (None: reduced after the drain)
            "buckets_per_stage": [b.buckets for b in last["costs"].buckets] if "costs" in last else None,
            "bucket_cpu_s_per_stage": [b.cpu_s for b in last["costs"].buckets] if "costs" in last else None}


METHODS = ("partitioner", "simulated", "timed")


def _errors(partitioner, simulated, timed, measured) -> dict[str, list[float] | None]:
    """Per method, each stage's predicted / measured - 1 (measured: the mean over its ranks of each
    rank's median busy time per step)."""
    return {k: None if v is None else [p / m - 1 for p, m in zip(v, measured)]
            for k, v in zip(METHODS, (partitioner, simulated, timed))}


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per method over every row and stage: the median and largest |error|, and how many are within 10%."""
    out = {}
    for k in METHODS:
        errs = [abs(e) for run in runs for r in run["rows"] for e in ((r["busy_errors"] or {}).get(k) or [])]
        if errs:
            out[k] = {"median_abs": statistics.median(errs), "max_abs": max(errs), "n": len(errs),
                      "within_10pct": sum(e <= 0.10 for e in errs)}
    return out


def pair_ratio(run: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """Row `b`'s step over row `a`'s (> 1: `a` faster), from their paired round medians, with the
    95% interval `caramel.stats.paired_ratio_interval` gives (one value per round). A row the run
    cannot pair (no runtime stats, no round medians, a zero median) is refused by name."""
    from caramel.stats import paired_ratio_interval

    rows = run["measured"]
    for n in (a, b):
        if n not in rows:
            raise SystemExit(f"--pair {a}::{b}: {run['run']} has no pipeline row {n!r} with runtime stats; "
                             f"its rows: {', '.join(rows)}")
        if not rows[n]["round_medians_s"] or statistics.median(rows[n]["round_medians_s"]) <= 0:
            raise SystemExit(f"--pair {a}::{b}: {run['run']}'s row {n!r} has no positive round medians "
                             "(round_medians_s); expected a run of `caramel bench` with rounds")
    ra, rb = rows[a]["round_medians_s"], rows[b]["round_medians_s"]
    ci = paired_ratio_interval(ra, rb, 1)
    return {"a": a, "b": b, "a_median_s": rows[a]["median_s"], "b_median_s": rows[b]["median_s"],
            "b_over_a_rounds": statistics.median(rb) / statistics.median(ra),
            "ci95": None if ci is None else [1 / ci[1], 1 / ci[0]], "rounds": min(len(ra), len(rb))}


def _co(spans):
    from caramel.strategies.pipeline.sharing import co_computing

    return co_computing(spans)


def _own(spans: list[list[tuple[float, float]]], cover: _Coverage, lane: int) -> float:
    """Over lane `lane`'s compute time, how many lanes compute at once (itself included)."""
    own = [(a, b) for a, b in spans[lane] if b > a]
    total = sum(b - a for a, b in own)
    return sum(cover.load(a, b) * (b - a) for a, b in own) / total if total else 0.0


def _spied(simulate, box: dict[str, Any]):
    """`simulate()` keeping the last replay's `PipelineSim` (the settled pass's) in `box["sim"]`
    and, where the replicas' reduction overlaps the pipeline, the `StageCosts` that replay ran in
    `box["costs"]` (their buckets, with the charge the spec asks for; absent otherwise)."""
    from caramel.strategies.pipeline import simulate as sim_module

    orig, orig_overlapped = sim_module.lane_meta, sim_module.replay_overlapped

    def spy(sim, replicas):
        box["sim"], box["replicas"] = sim, replicas
        return orig(sim, replicas)

    def spy_overlapped(costs, *args, **kwargs):
        box["costs"] = costs
        return orig_overlapped(costs, *args, **kwargs)

    sim_module.lane_meta, sim_module.replay_overlapped = spy, spy_overlapped
    try:
        return simulate()
    finally:
        sim_module.lane_meta, sim_module.replay_overlapped = orig, orig_overlapped


def _lane_loads(sim, cluster, per_lane: int) -> list[dict[str, float]]:
    """Per simulated lane, over its own compute time: the lanes computing at once (itself
    included) and the lanes with a transfer on the wire, and the host load the sharing model
    would read from these (computing + the spec's transfer CPU share x transferring), each lane
    standing for its `per_lane` replicas (`sharing.in_step`; 4 ranks on one host assumed, as on the
    bench's host)."""
    from caramel.strategies.pipeline.sharing import transfer_cpu_share

    share = transfer_cpu_share(cluster)
    computing, wire_cover = _Coverage(sim.compute_s), _Coverage(sim.wire_s)
    out = []
    for p in range(len(sim.compute_s)):
        own = [(a, b) for a, b in sim.compute_s[p] if b > a]
        total = sum(b - a for a, b in own) or 1.0
        comp = sum(computing.load(a, b) * (b - a) for a, b in own) / total
        wire = sum(wire_cover.load(a, b) * (b - a) for a, b in own) / total
        out.append({"computing": comp * per_lane, "transferring": wire * per_lane,
                    "load": (comp + share * wire) * per_lane})
    return out


def replay_run(run: str, only: list[str] | None = None, sharing_model: str | None = None,
               reduce_cpu: str | None = None, reduce_buckets: str | None = None) -> dict[str, Any]:
    """`run`'s pipeline rows replayed (`only`: those of these names) and every pipeline row's
    measured median and round medians (what `pair_ratio` reads). `sharing_model`: the host-sharing
    model to replay with where the run measured host sharing (None: the one its profile names).
    `reduce_cpu`: the spec's charge for the replicas' buckets' CPU (None: the spec's default).
    `reduce_buckets`: the spec's buckets for the replicas ("layers", "planner"; None: the default)."""
    from pipeline_contention import inputs_cluster

    from caramel.profile.turns import sharing_of

    paths = glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json"))
    if len(paths) != 1 or not os.path.isfile(os.path.join(run, "bench.json")):
        raise SystemExit(f"{run}: expected bench.json and one trace/*/prediction_inputs.json, found {len(paths)}")
    inputs = json.load(open(paths[0]))
    prof, plain = inputs_cluster(inputs)
    cluster = dataclasses.replace(plain, **sharing_of(prof))
    if sharing_model is not None and cluster.ranks_per_host > 1:
        cluster = dataclasses.replace(cluster, sharing_model=sharing_model)
    if reduce_cpu is not None:
        cluster = dataclasses.replace(cluster, reduce_cpu=reduce_cpu)
    if reduce_buckets is not None:
        cluster = dataclasses.replace(cluster, reduce_buckets=reduce_buckets)
    bench = json.load(open(os.path.join(run, "bench.json")))
    pipes = _pipeline_records(bench)
    rows = [replay_row(prof, cluster, inputs["world"], rec, os.path.dirname(paths[0]))
            for rec in pipes if only is None or rec["strategy"] in only]
    measured = {rec["strategy"]: {"median_s": rec["step_time_median_s"], "round_medians_s": rec.get("round_medians_s")}
                for rec in pipes}
    return {"run": run, "code": bench.get("meta", {}).get("code"), "rows": rows,  # the code the run ran
            "measured": measured, "collective_cpu_s": cluster.collective_cpu_s, "world": inputs["world"]}


def _pipeline_records(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's pipeline rows with runtime stats: those `replay_run` replays and `pair_ratio` reads."""
    return [rec for rec in bench["records"] if rec["strategy"].startswith("pipeline") and rec.get("pipeline")]


def _pipeline_rows(run: str) -> list[str]:
    """The strategy names of a run's pipeline rows with runtime stats, as its bench.json names them."""
    path = os.path.join(run, "bench.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{run}: no bench.json; expected a run directory of "
                         "`caramel bench --trace DIR --json DIR/bench.json`")
    return [r["strategy"] for r in _pipeline_records(json.load(open(path)))]


def _ms(xs) -> str:
    return "[" + ", ".join(f"{1e3 * x:.1f}" for x in xs) + "]" if xs else "-"


def markdown(runs: list[dict[str, Any]], command: str, code: str, totals: dict[str, dict[str, float]]) -> str:
    out = ["# Pipeline stage busy time: simulated against the runtime's timers", "",
           f"Code {code}; `{command}`", "",
           "| run | strategy (layout run) | step measured | predicted | partitioner per stage | simulated compute "
           "| simulated, timer's view | measured per rank (median per step) |", "|---|---|---:|---:|---|---|---|---|"]
    for run in runs:
        for r in run["rows"]:
            out.append(f"| {os.path.basename(run['run'])} | `{r['layout']}` | {1e3 * r['measured_s']:.1f} | "
                       f"{1e3 * r['predicted_s']:.1f} ({100 * r['error']:+.1f}%) | {_ms(r['partitioner_s_per_stage'])} | "
                       f"{_ms(r['simulated_busy_s_per_lane'])} | {_ms(r['simulated_timed_s_per_lane'])} | "
                       f"{_ms(r['measured_busy_s_per_rank'])} (stages {r['rank_stage']}) |")
    out += ["", "Busy time per stage against the mean of its ranks' measured (each rank's median per step; equal "
                "layouts): "
                + "; ".join(f"{k}: median |error| {100 * v['median_abs']:.1f}%, largest {100 * v['max_abs']:.1f}%, "
                            f"{v['within_10pct']} of {v['n']} within 10%" for k, v in totals.items())]
    for run in runs:
        for p in run.get("pairs") or []:
            ci = "-" if p["ci95"] is None else f"{p['ci95'][0]:.3f}-{p['ci95'][1]:.3f}"
            out.append(f"- {os.path.basename(run['run'])}: `{p['b']}` / `{p['a']}` {p['b_over_a_rounds']:.3f} "
                       f"(95% interval {ci}, {p['rounds']} paired round medians)")
    out += ["", "Per action (median over the kept steps and the stage's ranks): measured ms, x the profile's cost "
                "at that microbatch (speed 1), ranks computing at once over it.", ""]
    for run in runs:
        for r in run["rows"]:
            cells = []
            for st in r["stages"]:
                acts = ", ".join(f"{a['action']} {a['measured_ms']:.1f} (x{a['slowdown']:.2f}, {a['ranks_at_once']:.2f})"
                                 for a in st["actions"])
                cells.append(f"stage {st['stage']}: {acts}")
            out.append(f"- {os.path.basename(run['run'])} `{r['layout']}`: " + "; ".join(cells))
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    from caramel.bench.provenance import code_version
    from caramel.jsonio import write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench run directories (bench.json, trace/)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--markdown", help="write the tables here")
    ap.add_argument("--pair", action="append", default=[], metavar="A::B",
                    help="two rows' strategy names (as the run's bench.json names them): B's step over A's, paired by round")
    args = ap.parse_args(argv)
    pairs = []
    for p in args.pair:
        if p.count("::") != 1:
            raise SystemExit(f"--pair {p!r}: expected two strategy names joined by '::'")
        pairs.append(tuple(p.split("::")))
    for run_dir in args.runs:  # every pair names two pipeline rows of every run, checked before any replay
        names = _pipeline_rows(run_dir)
        for a, b in pairs:
            missing = [n for n in (a, b) if n not in names]
            if missing:
                raise SystemExit(f"--pair {a}::{b}: {run_dir} has no pipeline row {missing[0]!r} with runtime "
                                 f"stats; its rows: "
                                 f"{', '.join(names)}")
    runs = [replay_run(r) for r in args.runs]
    for run in runs:
        run["pairs"] = [pair_ratio(run, a, b) for a, b in pairs]
    code = code_version()
    command = "PYTHONPATH=. python experiments/pipeline_stage_busy.py " + " ".join(argv)
    for run in runs:
        for r in run["rows"]:
            print(f"{run['run']}: {r['layout']}: measured {1e3 * r['measured_s']:.1f} ms, predicted "
                  f"{1e3 * r['predicted_s']:.1f} ({100 * r['error']:+.1f}%); busy ms partitioner "
                  f"{_ms(r['partitioner_s_per_stage'])}, simulated {_ms(r['simulated_busy_s_per_lane'])}, timer's view "
                  f"{_ms(r['simulated_timed_s_per_lane'])}, measured {_ms(r['measured_busy_s_per_rank'])}")
        for p in run["pairs"]:
            ci = "-" if p["ci95"] is None else f"{p['ci95'][0]:.3f}-{p['ci95'][1]:.3f}"
            print(f"{run['run']}: {p['b']} / {p['a']}: {p['b_over_a_rounds']:.3f} ({ci}, {p['rounds']} rounds)")
    totals = summary(runs)
    for k, v in totals.items():
        print(f"busy per stage, {k}: median |error| {100 * v['median_abs']:.1f}%, largest {100 * v['max_abs']:.1f}%, "
              f"{v['within_10pct']} of {v['n']} within 10%")
    if args.json:
        write_json(args.json, {"format": "caramel.experiments.pipeline_stage_busy/1", "code": code,
                               "command": command, "runs": runs, "summary": totals})
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(runs, command, code, totals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
