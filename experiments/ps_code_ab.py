"""Two code trees side by side on one ps configuration: TAC and random order under each.

Each round runs `examples/ps_servers.py` of both trees (`--a DIR`, `--b DIR`: checkouts of the
project; each job runs with PYTHONPATH=DIR) under `caramel cluster run`, once per order; the
four jobs of a round go in an order that alternates by round, so drift on the shared host hits
both trees alike. Reports per order B's speed-up over A (median(A step) / median(B step) over
every timed step, with the 95% interval of the paired rounds), TAC's speed-up over random
within each tree, and TicTac's E and S as each run reports them. E and S rest on each run's
own profile (S = (U - L) / L), so a shift in S between the trees is a shift in E's reference,
not the runtime's: each job also records its profile's `pull_comm_s` (None from a tree whose
`examples/ps_servers.py` does not report it).

    python experiments/ps_code_ab.py --a OLD --b NEW --rounds 4 --out docs/results/NAME   # run alone on the host
    (hierarchical: --spec ps:hierarchical=true --workers 2 --nproc-per-node 2, 2 hosts of 2 ranks)

Writes PATH.json and PATH.md (the table; a "## Reading" section already at the end of PATH.md
is kept).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from caramel.bench.provenance import code_version
from caramel.jsonio import format_tag, write_json
from caramel.stats import median, paired_ratio_interval

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.ps_order_paths import job_line, run_job, spec_of  # noqa: E402

ORDERS = ("random", "tac")
TREES = ("a", "b")


def check_steps(res: dict, per_round: int, job: str) -> None:
    """The paired interval takes each job's timed steps as one round: a job must report exactly
    --steps - --warmup of them."""
    got = len(res.get("step_s") or [])
    if got != per_round:
        raise SystemExit(f"{job}: expected {per_round} timed steps (--steps - --warmup), the job reported {got}")


def ratio(ref: list[dict], cand: list[dict], per_round: int) -> dict:
    r = [s for x in ref for s in x["step_s"]]
    c = [s for x in cand for s in x["step_s"]]
    return {"point": median(r) / median(c), "interval_95": paired_ratio_interval(r, c, per_round)}


def summarize(runs: dict, per_round: int, orders: tuple[str, ...] = ORDERS) -> dict:
    out = {"b_over_a": {o: ratio(runs["a"][o], runs["b"][o], per_round) for o in orders},
           "median_step_ms": {t: {o: median([s for x in runs[t][o] for s in x["step_s"]]) * 1e3 for o in orders}
                              for t in TREES},
           "E_rounds": {t: {o: [x["E_median"] for x in runs[t][o]] for o in orders} for t in TREES},
           "S_rounds": {t: {o: [x["S"] for x in runs[t][o]] for o in orders} for t in TREES}}
    if set(ORDERS) <= set(orders):
        out["tac_over_random"] = {t: ratio(runs[t]["random"], runs[t]["tac"], per_round) for t in TREES}
    return out


def markdown(result: dict) -> str:
    s = result["summary"]
    orders = tuple(result.get("orders", ORDERS))

    def fmt(x: dict) -> str:
        iv = x["interval_95"]
        return f"**{x['point']:.3f}x** ({'n/a' if iv is None else f'{iv[0]:.3f}-{iv[1]:.3f}'})"
    lines = [f"# Two code trees side by side: {result['what']}", "",
             f"Command: `{result['command']}`", "",
             f"A = {result['trees']['a']}, B = {result['trees']['b']}", "",
             "| | " + " | ".join(orders) + " |", "|---" * (len(orders) + 1) + "|",
             "| B over A (speed-up, 95% interval) | " + " | ".join(fmt(s["b_over_a"][o]) for o in orders) + " |"]
    for t in TREES:
        ms = s["median_step_ms"][t]
        lines.append(f"| median step {t.upper()} (ms) | " + " | ".join(f"{ms[o]:.1f}" for o in orders) + " |")
    for t in TREES:
        e, st = s["E_rounds"][t], s["S_rounds"][t]
        lines.append(f"| E of {t.upper()}: median of the meaningful rounds (rounds) | " + " | ".join(
            e_cell(e[o], st[o]) for o in orders) + " |")
    median_s = result.get("S_median_over_steps") or {}
    for t in TREES:
        st = s["S_rounds"][t]
        how = {True: "each run's median over E's steps",
               False: "each run's last step's"}.get(median_s.get(t), "each run's as its tree reports it")
        lines.append(f"| S of {t.upper()}: median ({how}) | " + " | ".join(
            f"{statistics.median(st[o]):.2f}" for o in orders) + " |")
    if "tac_over_random" in s:
        lines += ["", "TAC over random: " + "; ".join(f"{t.upper()} {fmt(s['tac_over_random'][t])}" for t in TREES)]
    lines += ["", "Per job (round, tree, order): median step ms, E, S, 1-minute load before -> after:", ""]
    lines += [job_line(j, j["tree"].upper()) for j in result["jobs"]]
    return "\n".join(lines) + "\n"


def e_cell(es: list[float], ss: list[float]) -> str:
    """The median of the rounds' E where E means something (`tictac.e_reading`: S >= 0.2 and
    0 <= E <= 1), how many of the rounds that is, and every round's E."""
    from caramel.strategies.ps.tictac import e_reading

    kept = [v for v in (e_reading(e, s_)[0] for e, s_ in zip(es, ss)) if v is not None]
    rounds = ", ".join(f"{v:.2f}" for v in es)
    if not kept:
        return f"none of {len(es)} meaningful ({rounds})"
    return f"{statistics.median(kept):.2f}" + ("" if len(kept) == len(es) else f" over {len(kept)} of {len(es)}") + \
        f" ({rounds})"


def s_is_median(tree: Path) -> bool:
    """Whether a checkout's `stats_dict()` gives S as the median over E's steps (since it reports
    `beyond_U_over_L_median` beside it) rather than the last step's S."""
    ps = tree / "caramel" / "strategies" / "ps"
    return any("beyond_U_over_L_median" in p.read_text() for p in (ps / "run.py", ps / "tictac.py") if p.is_file())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the reference code tree (a checkout)")
    ap.add_argument("--b", required=True, help="the candidate code tree")
    ap.add_argument("--spec", default="ps", help="the ps spec without its order (default ps: colocated)")
    ap.add_argument("--workers", type=int, default=2, help="emulated hosts (default 2)")
    ap.add_argument("--nproc-per-node", type=int, default=1, help="ranks per host (default 1; "
                    "hierarchical=true needs more than 1)")
    ap.add_argument("--bandwidth", default="300mbit")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", required=True, help="PATH: writes PATH.json and PATH.md")
    ap.add_argument("--orders", default=",".join(ORDERS), help="comma-separated orders to run under each tree "
                    f"(default {','.join(ORDERS)}; TAC over random is reported only with both)")
    args = ap.parse_args(argv)
    args.orders = tuple(o for o in args.orders.split(",") if o)
    if not args.orders or len(set(args.orders)) != len(args.orders) or not set(args.orders) <= set(ORDERS):
        ap.error(f"--orders: expected distinct orders among {', '.join(ORDERS)}, got {','.join(args.orders) or 'none'}")
    for t in TREES:
        if not (Path(getattr(args, t)) / "examples/ps_servers.py").is_file():
            ap.error(f"--{t}: expected a checkout of the project (no examples/ps_servers.py in {getattr(args, t)!r})")
    if args.workers < 2:
        ap.error(f"--workers: expected at least 2 (a ps A/B needs links between ranks), got {args.workers}")
    if args.nproc_per_node < 1:
        ap.error(f"--nproc-per-node: expected at least 1, got {args.nproc_per_node}")
    if args.spec.split(":")[0].split(",")[0] != "ps":
        ap.error(f"--spec: expected a ps spec (ps or ps:OPTIONS), got {args.spec!r}")
    if "order=" in args.spec:
        ap.error(f"--spec: expected a spec without order= (the script runs each of {', '.join(ORDERS)}), got {args.spec!r}")
    if args.rounds < 1 or not 0 <= args.warmup < args.steps:
        ap.error(f"expected --rounds >= 1 and 0 <= --warmup < --steps, got {args.rounds}, {args.warmup}, {args.steps}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    trees = {t: Path(getattr(args, t)).resolve() for t in TREES}
    plan = [(t, o) for t in TREES for o in args.orders]
    launch = ["--workers", str(args.workers)] + (["--nproc-per-node", str(args.nproc_per_node)]
                                                 if args.nproc_per_node > 1 else [])
    runs: dict = {t: {o: [] for o in args.orders} for t in TREES}
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for t, o in (plan if r % 2 == 0 else plan[::-1]):
                res = run_job(launch, spec_of(args.spec, o), args,
                              Path(tmp) / f"{t}-{o}-{r}.json", tree=trees[t])
                if res.get("E_median") is None or res.get("S") is None:
                    raise SystemExit(f"round {r} {t} {o}: no TicTac E/S reported; give it more --steps after --warmup")
                check_steps(res, args.steps - args.warmup, f"round {r} {t} {o}")
                runs[t][o].append(res)
                jobs.append({"round": r, "tree": t, "order": o, **{k: res.get(k) for k in (
                    "median_step_ms", "E_median", "S", "pull_comm_s", "load_before", "load_after", "wall_s", "step_s")}})
                print(f"round {r} {t} {o}: {res['median_step_ms']:.1f} ms E {res['E_median']:.2f}", flush=True)
    hosts = f"{args.workers} workers" if args.nproc_per_node == 1 else \
        f"{args.workers} hosts of {args.nproc_per_node} ranks"
    result = {"format": format_tag("ps-code-ab"), "command": "python experiments/ps_code_ab.py " + " ".join(sys.argv[1:]),
              "trees": {t: code_version(trees[t]) for t in TREES},
              "what": f"{args.spec}, {hosts} at {args.bandwidth}, ResNet-18 width 16, batch 8, "
                      f"rank 0's steps {args.warmup}-{args.steps - 1}, {args.rounds} rounds",
              "orders": list(args.orders), "S_median_over_steps": {t: s_is_median(trees[t]) for t in TREES},
              "summary": summarize(runs, args.steps - args.warmup, args.orders),
              "jobs": jobs}
    write_json(f"{args.out}.json", result)
    md = Path(f"{args.out}.md")
    old = md.read_text() if md.exists() else ""
    md.write_text(markdown(result) + (old[old.index("\n## Reading"):] if "\n## Reading" in old else ""))
    print(markdown(result))


if __name__ == "__main__":
    main()
