"""Does the pull timeline's instrumentation move TicTac's E? Plain runs beside timeline runs.

The instrumented timeline (`experiments/ps_pull_timeline.py`) once read a median E of TAC of
0.82 where side-by-side runs of `examples/ps_servers.py` (`ps_code_ab.py`) read 0.62-0.80.
Both report the E of rank 0's per-step log; this runs the two, same code, spec, cluster and
step count, alternating within each round (the order flips by round), and scores both the
same way (the log's last three quarters, as `stats_dict()`), so what differs between them is
the instrumentation alone (a thread polling every pending pull every 0.5 ms and the timed
wrappers). Reports per kind E per run and its median, the timeline's E minus the plain E
(mean over the paired rounds with a 95% t interval), the step-time ratio plain/timeline
(paired interval over the rounds' steps), and per run the parts E is made of (TicTac's
E = (comm - wait) / min(compute, comm), compute = makespan - wait, comm = the profile's
`pull_comm_s`): median wait, makespan and compute per step.

    python experiments/ps_e_measures.py --rounds 4 --out docs/results/NAME   # run alone on the host
    (hierarchical: --spec ps:hierarchical=true --workers 2 --nproc-per-node 2 --bandwidth 100mbit)

Writes PATH.json and PATH.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from caramel.bench.provenance import code_version
from caramel.jsonio import format_tag, write_json
from caramel.stats import median, paired_ratio_interval, t_interval
from caramel.strategies.ps.tictac import steady_medians

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("plain", "timeline", "timeline-nopoll")  # the last: the timeline's wrappers without its polling thread


def steady_parts(log: list[dict], pull_comm_s: float) -> dict:
    """E and S as `stats_dict()` scores them (`steady_medians`: medians over the log's last three
    quarters' steps with E) and the medians of E's parts over the same steps."""
    medians = steady_medians(log)
    if not medians["E_steps"]:
        raise SystemExit("ps_e_measures: a run logged no E (give it more --steps)")
    steady = [x for x in log[len(log) // 4:] if "E" in x]
    ms = [x["makespan_s"] for x in steady if "makespan_s" in x]
    return {"E_median": medians["E_median"], "S": medians["S"],
            "wait_ms": statistics.median(x["wait_s"] for x in steady) * 1e3,
            "forward_ms": statistics.median(x["forward_s"] for x in steady) * 1e3,
            "makespan_ms": statistics.median(ms) * 1e3 if ms else None,
            "pull_comm_ms": pull_comm_s * 1e3, "E_steps": medians["E_steps"]}


def run_one(kind: str, args: argparse.Namespace, tmp: Path) -> dict:
    """One job under `caramel cluster run`: the example (plain) or the timeline recorder."""
    launch = ["--workers", str(args.workers)] + (["--nproc-per-node", str(args.nproc_per_node)]
                                                 if args.nproc_per_node > 1 else [])
    out = tmp / f"{kind}-{time.monotonic_ns()}"
    common = ["--strategy", args.spec, "--steps", str(args.steps)]
    if kind == "plain":
        script = [str(ROOT / "examples/ps_servers.py"), *common, "--warmup", str(args.warmup), "--json", f"{out}.json"]
    else:
        script = [str(ROOT / "experiments/ps_pull_timeline.py"), *common, "--out", str(out)]
        script += ["--poll-ms", "0"] if kind == "timeline-nopoll" else []
    cmd = [sys.executable, "-m", "caramel.cli", "cluster", "run", *launch, "--bandwidth", args.bandwidth,
           "--timeout", "5m", "--", sys.executable, *script]
    load0, t0 = os.getloadavg()[0], time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    if kind == "plain":
        res = json.loads(Path(f"{out}.json").read_text())
        log, step_s = res["log"], res["step_s"]
    else:
        res = json.loads((out / "rank0.json").read_text())
        log = res["log"]
        steps = sorted((e for e in res["events"] if e["kind"] == "step"), key=lambda e: e["step"])
        step_s = [e["t_done"] - e["t"] for e in steps][args.warmup:]
    return {"kind": kind, **steady_parts(log, res["pull_comm_s"]), "reported_E": res["E_median"],
            "step_s": step_s, "median_step_ms": median(step_s) * 1e3,
            "load_before": load0, "load_after": os.getloadavg()[0], "wall_s": time.time() - t0}


def summarize(jobs: list[dict], per_round: int, kinds: tuple[str, ...] = KINDS[:2]) -> dict:
    """Per kind E and its parts; each instrumented kind against plain, paired by round."""
    by = {k: [j for j in jobs if j["kind"] == k] for k in kinds}
    plain = [s for j in by["plain"] for s in j["step_s"]]
    against = {}
    for k in kinds[1:]:
        diffs = [t["E_median"] - p["E_median"] for p, t in zip(by["plain"], by[k])]
        waits = [t["wait_ms"] - p["wait_ms"] for p, t in zip(by["plain"], by[k])]
        timed = [s for j in by[k] for s in j["step_s"]]
        against[k] = {"E_minus_plain": interval(diffs), "wait_ms_minus_plain": interval(waits),
                      "step_plain_over": {"point": median(plain) / median(timed),
                                          "interval_95": paired_ratio_interval(plain, timed, per_round)}}
    return {"kinds": list(kinds), "E_runs": {k: [j["E_median"] for j in by[k]] for k in kinds},
            "E_median": {k: statistics.median(j["E_median"] for j in by[k]) for k in kinds},
            "against_plain": against,
            "parts_median": {k: {p: statistics.median(j[p] for j in by[k] if j[p] is not None)
                                 for p in ("wait_ms", "forward_ms", "makespan_ms", "pull_comm_ms", "S")}
                             for k in kinds}}


def interval(values: list[float]) -> dict:
    """The mean of paired differences and its 95% t interval (None from one round)."""
    if len(values) < 2:
        return {"mean": values[0], "interval_95": None}
    mean, lo, hi = t_interval(values)
    return {"mean": mean, "interval_95": [lo, hi]}


def markdown(result: dict) -> str:
    s = result["summary"]
    kinds = s["kinds"]
    names = {"plain": "plain (`examples/ps_servers.py`)", "timeline": "timeline (`experiments/ps_pull_timeline.py`)",
             "timeline-nopoll": "timeline, no polling thread (`--poll-ms 0`)"}

    def iv(x: dict, fmt: str) -> str:
        return "n/a" if x["interval_95"] is None else f"{x['interval_95'][0]:{fmt}} to {x['interval_95'][1]:{fmt}}"
    lines = [f"# TicTac's E with and without the pull timeline's instrumentation: {result['what']}", "",
             f"Command: `{result['command']}`", "", f"Code: {result['tree']}", "",
             "| | " + " | ".join(names[k] for k in kinds) + " |", "|---|" + "---|" * len(kinds)]
    lines.append("| E of the run, median (runs) | " + " | ".join(
        f"{s['E_median'][k]:.2f} ({', '.join(f'{v:.2f}' for v in s['E_runs'][k])})" for k in kinds) + " |")
    for p in ("wait_ms", "forward_ms", "makespan_ms", "pull_comm_ms", "S"):
        lines.append(f"| {p} (median of the runs' medians) | " + " | ".join(
            f"{s['parts_median'][k][p]:.2f}" for k in kinds) + " |")
    lines.append("")
    for k, a in s["against_plain"].items():
        st = a["step_plain_over"]
        siv = "n/a" if st["interval_95"] is None else f"{st['interval_95'][0]:.3f}-{st['interval_95'][1]:.3f}"
        lines.append(f"{k} against plain, paired by round: E {a['E_minus_plain']['mean']:+.3f} (95% "
                     f"{iv(a['E_minus_plain'], '+.3f')}), wait {a['wait_ms_minus_plain']['mean']:+.1f} ms (95% "
                     f"{iv(a['wait_ms_minus_plain'], '+.1f')}); step time plain over it {st['point']:.3f}x ({siv})")
        lines.append("")
    lines += ["Per job (round, kind): median step ms, E, wait/makespan ms, load before -> after:", ""]
    lines += [f"- round {j['round']}, {j['kind']}: {j['median_step_ms']:.1f} ms, E {j['E_median']:.2f}, "
              f"wait {j['wait_ms']:.1f}, makespan {j['makespan_ms'] or float('nan'):.1f}, "
              f"load {j['load_before']:.1f} -> {j['load_after']:.1f}" for j in result["jobs"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="ps", help="the ps spec (default ps: colocated, TAC)")
    ap.add_argument("--workers", type=int, default=2, help="emulated hosts (default 2)")
    ap.add_argument("--nproc-per-node", type=int, default=1, help="ranks per host (default 1)")
    ap.add_argument("--bandwidth", default="300mbit")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the step times")
    ap.add_argument("--kinds", default="plain,timeline", help=f"the runs of each round, plain first "
                    f"(default plain,timeline; of {', '.join(KINDS)})")
    ap.add_argument("--out", required=True, help="PATH: writes PATH.json and PATH.md")
    args = ap.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(","))
    if kinds[0] != "plain" or len(kinds) < 2 or len(set(kinds)) != len(kinds) or not set(kinds) <= set(KINDS):
        ap.error(f"--kinds: expected plain then one or more of {', '.join(KINDS[1:])}, each once, got {args.kinds!r}")
    args.kinds = kinds
    if args.spec.split(":")[0].split(",")[0] != "ps":
        ap.error(f"--spec: expected a ps spec (ps or ps:OPTIONS), got {args.spec!r}")
    if args.workers < 2 or args.nproc_per_node < 1:
        ap.error(f"expected --workers >= 2 and --nproc-per-node >= 1, got {args.workers}, {args.nproc_per_node}")
    if args.rounds < 1 or not 0 <= args.warmup < args.steps:
        ap.error(f"expected --rounds >= 1 and 0 <= --warmup < --steps, got {args.rounds}, {args.warmup}, {args.steps}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind in (args.kinds if r % 2 == 0 else args.kinds[::-1]):
                res = run_one(kind, args, Path(tmp))
                if len(res["step_s"]) != args.steps - args.warmup:
                    raise SystemExit(f"round {r} {kind}: expected {args.steps - args.warmup} timed steps, "
                                     f"got {len(res['step_s'])}")
                jobs.append({"round": r, **res})
                print(f"round {r} {kind}: {res['median_step_ms']:.1f} ms E {res['E_median']:.2f}", flush=True)
    hosts = f"{args.workers} workers" if args.nproc_per_node == 1 else f"{args.workers} hosts of {args.nproc_per_node} ranks"
    result = {"format": format_tag("ps-e-measures"), "command": "python experiments/ps_e_measures.py " + " ".join(sys.argv[1:]),
              "tree": code_version(ROOT), "what": f"{args.spec}, {hosts} at {args.bandwidth}, ResNet-18 width 16, batch 8, "
              f"{args.steps} steps, {args.rounds} rounds", "summary": summarize(jobs, args.steps - args.warmup, args.kinds), "jobs": jobs}
    write_json(f"{args.out}.json", result)
    Path(f"{args.out}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
