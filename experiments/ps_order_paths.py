"""TAC against random pull order with dedicated servers and with hierarchical aggregation.

Each round runs `examples/ps_servers.py` under `caramel cluster run` once per configuration
and order, the two orders one after the other (which goes first alternates by round), so
drift on the shared host hits both alike. Per configuration: TAC's speed-up over random,
median(random step) / median(TAC step) over every timed step, with the 95% interval of the
paired rounds (`caramel.stats.paired_ratio_interval`), and TicTac's E and S as each run
reports them (`stats_dict()`: per step from the first pull handed over to the forward's end).

    python experiments/ps_order_paths.py --rounds 3 --out docs/results/ps_order_paths   # run alone on the host

`--from-json PATH.json` writes PATH.md again from a stored result (the table from the JSON; a
"## Reading" section already at the end of PATH.md is kept below it); the run options and
`--out` are refused with it. The page's title and description name the configurations the
result ran. A job that reports no E stops the run after writing the jobs so far to
PATH.partial.json.
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
from caramel.stats import median, paired_ratio_interval

# name -> (the launch's options, the ps spec without its order)
CONFIGS = {
    "dedicated": (["--workers", "4", "--ps-servers", "2"], "ps"),  # 2 workers + 2 server processes
    "hierarchical": (["--workers", "2", "--nproc-per-node", "2"], "ps:hierarchical=true"),  # 2 nodes of 2
}
ORDERS = ("random", "tac")
# name -> (the page title's words, the setup as the description names it)
SETUPS = {
    "dedicated": ("dedicated servers", "2 workers + 2 server processes on 4 hosts"),
    "hierarchical": ("hierarchical aggregation", "2 hosts of 2 ranks (LOCAL_WORLD_SIZE 2, the hosts' first ranks serve)"),
}
RUN_DEFAULTS = {"rounds": 3, "steps": 40, "warmup": 10, "bandwidth": "300mbit", "configs": ",".join(CONFIGS)}


def spec_of(base: str, order: str) -> str:
    return f"{base}{',' if ':' in base else ':'}order={order}"


def run_job(launch: list[str], spec: str, args: argparse.Namespace, out: Path, tree: Path | None = None) -> dict:
    """One `examples/ps_servers.py` job under `caramel cluster run`; `tree` runs another
    checkout's example with PYTHONPATH and cwd set to it (default: this one, as launched)."""
    root = tree or Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "caramel.cli", "cluster", "run", *launch, "--bandwidth", args.bandwidth,
           "--timeout", "5m", "--", sys.executable, str(root / "examples/ps_servers.py"),
           "--strategy", spec, "--steps", str(args.steps), "--warmup", str(args.warmup), "--json", str(out)]
    in_tree = {} if tree is None else {"env": dict(os.environ, PYTHONPATH=str(tree)), "cwd": str(tree)}
    load0 = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, **in_tree)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    res.update(load_before=load0, load_after=os.getloadavg()[0], wall_s=time.time() - t0)
    return res


def job_line(j: dict, label: str) -> str:
    """One job's line of the per-job list: its round, `label` (what it ran), its order and numbers."""
    return (f"- round {j['round']}, {label}, {j['order']}: {j['median_step_ms']:.1f} ms, "
            f"E {j['E_median']:.2f}, S {j['S']:.2f}, load {j['load_before']:.1f} -> {j['load_after']:.1f}")


def check_e(res: dict, job: str, partial: str | None = None) -> None:
    """A run without E (too few steady steps for the online profile's reference) is an error;
    `partial` names where the jobs finished so far were written."""
    if res.get("E_median") is None or res.get("S") is None:
        kept = f" (the jobs so far: {partial})" if partial else ""
        raise SystemExit(f"job {job}: the run reported no TicTac E/S (E_median={res.get('E_median')}, "
                         f"S={res.get('S')}); expected numbers: give it more --steps after --warmup{kept}")


def summarize(runs: dict[str, list[dict]], per_round: int) -> dict:
    steps = {o: [s for r in runs[o] for s in r["step_s"]] for o in ORDERS}
    point = median(steps["random"]) / median(steps["tac"])
    interval = paired_ratio_interval(steps["random"], steps["tac"], per_round)
    return {"tac_speedup_over_random": point, "interval_95": interval,
            "median_step_ms": {o: median(steps[o]) * 1e3 for o in ORDERS},
            "round_medians_ms": {o: [r["median_step_ms"] for r in runs[o]] for o in ORDERS},
            "E_median": {o: statistics.median(r["E_median"] for r in runs[o]) for o in ORDERS},
            "E_rounds": {o: [r["E_median"] for r in runs[o]] for o in ORDERS},
            "S": {o: [r["S"] for r in runs[o]] for o in ORDERS},
            "predicted_E": {o: runs["tac"][-1]["predicted"][o]["E"] for o in ORDERS},
            "pull_buckets": runs["tac"][-1]["pull_buckets"]}


def describe(configs: list[str], bandwidth: str, warmup: int, steps: int, rounds: int) -> str:
    setups = "; ".join(f"{c}: {SETUPS[c][1]}" for c in configs)
    return (f"ResNet-18 width 16, batch 8 per worker, SGD momentum, bsp, emulated hosts at {bandwidth}; {setups}; "
            f"rank 0's steps {warmup}-{steps - 1} of {steps} per job, {rounds} paired rounds")


def markdown(result: dict) -> str:
    """The page: its title and description name only the configurations the result ran (a
    stored description that names others, as earlier runs wrote it, is cut to those)."""
    ran = list(result["summary"])
    what = result["what"]
    for c in SETUPS:
        if c not in ran:
            what = what.replace(f"; {c}: {SETUPS[c][1]}", "")
    bandwidth = what.split("emulated hosts at ", 1)[1].split(";", 1)[0] if "emulated hosts at " in what else None
    title = " and ".join(SETUPS[c][0] for c in ran) + (f" at {bandwidth}" if bandwidth else "")
    lines = [f"# TAC against random order: {title}", "",
             f"Command: `{result['command']}`", "",
             f"Code {result['code']}; {what}", "",
             "| configuration | TAC speed-up over random (95% interval) | median step random / TAC (ms) "
             "| E of TAC (rounds) | E of random (rounds) | S of TAC (rounds) | predicted E TAC / random |",
             "|---|---|---|---|---|---|---|"]
    for name, s in result["summary"].items():
        lo_hi = "n/a" if s["interval_95"] is None else f"{s['interval_95'][0]:.3f}-{s['interval_95'][1]:.3f}"
        e = {o: ", ".join(f"{x:.2f}" for x in s["E_rounds"][o]) for o in ORDERS}
        s_tac = f"{statistics.median(s['S']['tac']):.2f} ({', '.join(f'{x:.2f}' for x in s['S']['tac'])})"
        lines.append(f"| {name} | **{s['tac_speedup_over_random']:.3f}x** ({lo_hi}) | "
                     f"{s['median_step_ms']['random']:.1f} / {s['median_step_ms']['tac']:.1f} | "
                     f"{s['E_median']['tac']:.2f} ({e['tac']}) | {s['E_median']['random']:.2f} ({e['random']}) | "
                     f"{s_tac} | {s['predicted_E']['tac']:.2f} / {s['predicted_E']['random']:.2f} |")
    lines += ["", "Per job (round, configuration, order): median step ms, E, S, 1-minute load before -> after:", ""]
    lines += [job_line(j, j["config"]) for j in result["jobs"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked: one error naming the bad input and what is expected."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = RUN_DEFAULTS
    ap.add_argument("--rounds", type=int, help=f"paired rounds (default {d['rounds']})")
    ap.add_argument("--steps", type=int, help=f"steps per job (default {d['steps']})")
    ap.add_argument("--warmup", type=int, help=f"steps left out: the online profile, warm-up (default {d['warmup']})")
    ap.add_argument("--bandwidth", help=f"the emulated hosts' links (default {d['bandwidth']})")
    ap.add_argument("--configs", help=f"some of {', '.join(CONFIGS)} (default all)")
    ap.add_argument("--out", help="PATH: writes PATH.json and PATH.md")
    ap.add_argument("--from-json", metavar="PATH.json", help="only write PATH.md again from this stored result")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        given = [f"--{k}" for k in [*RUN_DEFAULTS, "out"] if getattr(args, k) is not None]
        if given:
            ap.error(f"--from-json writes PATH.md again from the stored result; {', '.join(given)} "
                     "(run options, or --out) cannot be used with it")
        if not args.from_json.endswith(".json"):
            ap.error(f"--from-json: expected a PATH.json file, got {args.from_json!r}")
        if not Path(args.from_json).is_file():
            ap.error(f"--from-json: no such file {args.from_json!r}")
        return args
    for k, v in RUN_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.out is None:
        ap.error("--out PATH is required (or --from-json PATH.json)")
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1 paired round, got {args.rounds}")
    if not 0 <= args.warmup < args.steps:
        ap.error(f"--warmup {args.warmup} / --steps {args.steps}: expected 0 <= warmup < steps "
                 "(the timed steps are warmup..steps-1)")
    args.configs = args.configs.split(",")
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; expected some of {list(CONFIGS)}")
    return args


def rewrite_markdown(json_path: Path) -> str:
    """PATH.md from PATH.json, keeping the "## Reading" section PATH.md already ends with."""
    md_path = json_path.with_suffix(".md")
    old = md_path.read_text() if md_path.exists() else ""
    reading = old[old.index("\n## Reading"):] if "\n## Reading" in old else ""
    try:
        text = markdown(json.loads(json_path.read_text())) + reading
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise SystemExit(f"--from-json {str(json_path)!r}: not a stored ps_order_paths result "
                         f"({type(e).__name__}: {e})") from None
    md_path.write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_json is not None:
        print(rewrite_markdown(Path(args.from_json)))
        return
    configs = args.configs
    jobs, runs = [], {c: {o: [] for o in ORDERS} for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for c in configs:
                launch, base = CONFIGS[c]
                for order in (ORDERS if r % 2 == 0 else ORDERS[::-1]):
                    res = run_job(launch, spec_of(base, order), args, Path(tmp) / f"{c}-{order}-{r}.json")
                    jobs.append({"round": r, "config": c, "order": order, **{k: res.get(k) for k in (
                        "median_step_ms", "E_median", "S", "load_before", "load_after", "wall_s", "step_s")}})
                    if res.get("E_median") is None or res.get("S") is None:  # keep what finished
                        write_json(f"{args.out}.partial.json", {"format": format_tag("ps-order-paths-partial"),
                                                                "code": code_version(), "jobs": jobs})
                    check_e(res, f"round {r} {c} {order}", f"{args.out}.partial.json")
                    runs[c][order].append(res)
                    print(f"round {r} {c} {order}: {res['median_step_ms']:.1f} ms E {res['E_median']:.2f} "
                          f"S {res['S']:.2f} load {res['load_before']:.1f}", flush=True)
    result = {"format": format_tag("ps-order-paths"), "code": code_version(),
              "command": "python experiments/ps_order_paths.py " + " ".join(sys.argv[1:]),
              "what": describe(configs, args.bandwidth, args.warmup, args.steps, args.rounds),
              "summary": {c: summarize(runs[c], args.steps - args.warmup) for c in configs}, "jobs": jobs}
    write_json(f"{args.out}.json", result)
    Path(f"{args.out}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
