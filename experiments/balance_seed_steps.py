"""Per-step records of `balance="batch"` runs: where each rank's step goes, seed against seed.

`caramel train --workload digits ... --slow-worker 1:2` with `caramel:balance=batch` reached
1.3x equal shares' samples/s on some seeds and not others, one run per seed. This runs the
command several times per seed (balanced and equal shares back to back, their order alternating
between repetitions), keeps every run's per-rank traces, and splits each step of each rank into
its local batch size, compute (forward + backward + deferred + optimizer, less the slow rank's
nominal emulated sleep, delay x local batch: an oversleep on a loaded host stays in compute), the sleep, the waits on communication and the rest of the period (data, loss,
Python). Per run it reports the throughput, the delay the slow worker was calibrated to (and
every rank's calibration), both ranks' compute per sample in the run with (c_1 + delay) / c_0
(the slowdown the run had, where both ranks ran the same local batch: per-step costs are in
c), the shares over time and the trial's pick; `analyze` sums the pairs up per seed.

The split reads the engine's trace, so two kinds of step read differently: under forward
overlap the forward's span holds the previous step's waits and updates (compute overstated,
the rest negative), and while torch DDP runs the job (the trial's DDP block) the backward is
not in the trace (compute understated). The per-run medians are taken at the final shares,
and past the trial's last step where at least 10 steps are left (one schedule then); the
summary's step-split medians read only the runs that kept backward overlap.

    python -m experiments.balance_seed_steps run --seeds 0 1 4 --reps 5 --out DIR
    python -m experiments.balance_seed_steps analyze DIR --json docs/results/OUT.json
    python -m experiments.balance_seed_steps subnormals --seeds 0 1 4 --json docs/results/OUT.json  # untimed
    python -m experiments.balance_seed_steps run --seeds 0 1 2 3 4 --reps 2 --code old=CHECKOUT --code new=CHECKOUT --out DIR

With two `--code NAME=CHECKOUT` (two controllers side by side), each rep runs the balanced
command once per checkout (PYTHONPATH set to it, their order alternating) and each seed's first
rep runs equal shares once, between the two, under the first checkout; `analyze` then gives the
second's balanced samples/s over the first's per pair and each against its seed's equal run.

Run `run` alone on the host (a bench lock, a CPU group of its own): every number is a timing.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file too: `experiments.` imports

from caramel.jsonio import FormatError, atomic_write_text, check_format, format_tag, write_json  # noqa: E402
from caramel.stats import geomean, log_t_interval  # noqa: E402

COMMAND = ["train", "--workload", "digits", "--workers", "2", "--batch-size", "128", "--d-model", "1024",
           "--steps", "120", "--cluster", "off", "--slow-worker", "1:2", "--log-every-steps", "40", "--resume", "none"]
STRATEGIES = {"balanced": "caramel:balance=batch", "equal": "caramel:balance=batch,balance_every=0"}
SKIP_STEPS = 5  # the loop's summary skips the first 5 steps as warm-up; so do these medians
COMPUTE_KINDS = ("forward", "backward", "deferred", "optimizer")
MIN_SPLIT_STEPS = 10  # steps after the trial needed to split there; fewer: every step at the final shares
# run_all's directory names; with --code the balanced runs end in -NAME
RUN_NAME = re.compile(r"s(\d+)-r(\d+)-(" + "|".join(STRATEGIES) + r")(?:-([A-Za-z0-9_]+))?")
CODE_NAME = re.compile(r"[A-Za-z0-9_]+")


def parse_codes(specs: list[str]) -> dict[str, Path]:
    """`--code NAME=CHECKOUT` pairs: none (the installed caramel) or two, distinct names, existing checkouts."""
    codes: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not CODE_NAME.fullmatch(name) or not path:
            raise SystemExit(f"--code {spec}: expected NAME=CHECKOUT (NAME letters, digits or _)")
        if name in codes:
            raise SystemExit(f"--code {spec}: the name {name} is given twice")
        if not (Path(path) / "caramel" / "__init__.py").is_file():
            raise SystemExit(f"--code {spec}: {path} holds no caramel package (expected a checkout's root)")
        codes[name] = Path(path).resolve()
    if len(codes) not in (0, 2):
        raise SystemExit(f"--code given {len(codes)} times: expected none or two (A and B side by side)")
    return codes


def run_plan(seeds: list[int], reps: int, codes: list[str]) -> list[tuple[str, str, str | None]]:
    """(directory name, strategy tag, code name) in run order. Without codes each rep runs
    balanced and equal per seed; with two, balanced under each and, in rep 0 only, equal between
    them under the first code. The order alternates with rep + seed."""
    plan = []
    for rep in range(reps):
        for seed in seeds:
            flip = (rep + seed) % 2 == 1
            if not codes:
                order = [("balanced", None), ("equal", None)]
            else:
                order = [("balanced", codes[0]), ("balanced", codes[1])]
                if rep == 0:
                    order.insert(1, ("equal", None))
            for tag, code in (order[::-1] if flip else order):
                plan.append((f"s{seed}-r{rep}-{tag}" + (f"-{code}" if code else ""), tag, code))
    return plan


def run_all(seeds: list[int], reps: int, out: Path, caramel: str, codes: dict[str, Path] | None = None) -> None:
    """Each seed's runs back to back (`run_plan`); with `codes`, PYTHONPATH picks each run's checkout."""
    from caramel.bench.provenance import code_version
    codes = codes or {}
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds {' '.join(map(str, seeds))}: expected distinct seeds (a repeat overwrites its runs)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # an old run's summary.json would pass for a new run that failed before writing its own
        raise SystemExit(f"--out {out}: expected a new or empty directory")
    out = out.resolve()  # each run's working directory is its checkout (`python -m` workers import from it)
    for name, root in codes.items():  # neither the editable install nor another checkout may win
        got = subprocess.run([sys.executable, "-c", "import caramel; print(caramel.__file__)"], capture_output=True,
                             text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}).stdout.strip()
        if not got.startswith(str(root) + os.sep):
            raise SystemExit(f"--code {name}={root}: PYTHONPATH={root} imports caramel from {got or 'nowhere'}")
    out.mkdir(parents=True, exist_ok=True)
    names = list(codes)
    versions = {name: code_version(root) for name, root in codes.items()} or {None: code_version()}
    for name, tag, code in run_plan(seeds, reps, names):
        seed = int(RUN_NAME.fullmatch(name).group(1))
        root = codes[code or names[0]] if codes else None
        d = out / name
        d.mkdir()  # run.json goes here even when the run fails before writing
        t0 = time.time()
        cmd = [caramel, *COMMAND, "--seed", str(seed), "--strategy", STRATEGIES[tag], "--out-dir", str(d)]
        env = {**os.environ, "PYTHONPATH": str(root)} if root else None
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
        write_run_meta(d, {"cmd": cmd, "code": versions[code or (names[0] if names else None)],
                           "code_root": str(root or ""), "rc": proc.returncode, "start": t0, "end": time.time(),
                           "tail": proc.stdout[-2000:] + proc.stderr[-2000:]})
        print(f"{d.name}: rc {proc.returncode}, {time.time() - t0:.1f} s", flush=True)


RUN_META_KIND = "balance-seed-run"
RUN_META_KEYS = frozenset({"cmd", "code", "code_root", "rc", "start", "end", "tail"})


def write_run_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """A run's side file (`run.json`: command, checkout, exit status, times, output tail), tagged."""
    write_json(run_dir / "run.json", {"format": format_tag(RUN_META_KIND), **meta})


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    """A run's `run.json`, or {} where there is none. Run folders written before the tag hold the
    same keys untagged and are read as they are; anything else is refused naming the file."""
    path = run_dir / "run.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not JSON ({e}); expected a {format_tag(RUN_META_KIND)} file") from None
    if isinstance(data, dict) and "format" not in data and data.keys() <= RUN_META_KEYS:
        return data
    return check_format(data, RUN_META_KIND, str(path))


def shares_at(changes: list[list[Any]], batch: int) -> list[int]:
    """The counts in force for global batch `batch` ([from_batch, counts] pairs, ascending)."""
    counts = changes[0][1]
    for start, c in changes:
        if start <= batch:
            counts = c
    return counts


def step_records(run_dir: Path, rank: int, changes: list[list[Any]], delay_s: float, slow_rank: int) -> list[dict]:
    """One record per iteration of `rank`'s trace (module docstring); the last iteration has no period."""
    events = json.loads((run_dir / f"trace.rank{rank}.json").read_text())["events"]
    by_it: dict[int, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_it[e["iteration"]].append(e)
    its = sorted(by_it)
    starts = {i: min(e["start_s"] for e in by_it[i]) for i in its}
    out = []
    for i in its:
        n = shares_at(changes, i)[rank]
        dur = collections.Counter()
        for e in by_it[i]:
            dur[e["kind"] if e["lane"] != "wait" else "wait"] += e["duration_s"]
        sleep = delay_s * n if rank == slow_rank else 0.0
        compute = sum(dur[k] for k in COMPUTE_KINDS) - sleep
        period = starts[i + 1] - starts[i] if i + 1 in starts else None
        out.append({"it": i, "n": n, "compute_s": compute, "sleep_s": sleep, "wait_s": dur["wait"],
                    "optimizer_s": dur["optimizer"], "period_s": period,
                    "other_s": None if period is None else period - compute - sleep - dur["wait"]})
    return out


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def analyze_run(run_dir: Path) -> dict[str, Any]:
    s = json.loads((run_dir / "summary.json").read_text())
    meta = read_run_meta(run_dir)
    slow = s["slow_worker"]
    scheduled = s.get("share_changes") or [[0, [128, 128]]]
    # a decision at the run's last step schedules shares for batches the run never draws
    end = s.get("end_step")
    changes = [c for c in scheduled if end is None or c[0] < end] or scheduled[:1]
    last_change = changes[-1][0]
    recs = {r: step_records(run_dir, r, changes, slow["delay_per_sample_s"], slow["rank"]) for r in (0, 1)}
    steady = {r: [x for x in recs[r] if x["it"] >= SKIP_STEPS] for r in recs}
    trial = s.get("overlap_trial") or {}
    after = max(last_change, (trial.get("end_step") or 0) + 1)  # past the trial: one schedule, as kept
    final = {r: [x for x in steady[r] if x["it"] >= after] for r in recs}
    if len(final[0]) < MIN_SPLIT_STEPS:  # the trial ran to the end: all steps at the final shares
        after = last_change
        final = {r: [x for x in steady[r] if x["it"] >= after] for r in recs}
    per_rank = {}
    for r in recs:
        per_rank[str(r)] = {
            "compute_per_sample_s": med([x["compute_s"] / x["n"] for x in final[r]]),
            "compute_s": med([x["compute_s"] for x in final[r]]),
            "optimizer_s": med([x["optimizer_s"] for x in final[r]]),
            "wait_s": med([x["wait_s"] for x in final[r]]),
            "other_s": med([x["other_s"] for x in final[r]]),
            "period_s": med([x["period_s"] for x in final[r]]),
        }
    c0, c1 = per_rank["0"]["compute_per_sample_s"], per_rank["1"]["compute_per_sample_s"]
    return {
        "run": run_dir.name, "start": meta.get("start"), "code": meta.get("code"), "samples_per_s": s["samples_per_s"],
        "median_step_s": s["median_step_time_s"], "val_loss": s.get("val_loss"),
        "delay_per_sample_s": slow["delay_per_sample_s"],
        # older runs' summaries name every rank's calibration `per_rank_s`
        "calibrated_per_rank_s": slow.get("compute_per_sample_per_rank_s", slow.get("per_rank_s")),
        "share_changes": changes, "changes_past_end": scheduled[len(changes):],
        "final_shares": changes[-1][1], "final_from_batch": last_change,
        "split_from_step": after, "split_steps": len(final[0]),
        "per_rank_at_final_shares": per_rank,
        "slowdown_in_run": None if not (c0 and c1 is not None) else (c1 + slow["delay_per_sample_s"]) / c0,
        "delay_over_fast_compute": None if not c0 else slow["delay_per_sample_s"] / c0,
        "overlap": s.get("overlap"), "trial_chosen": trial.get("chosen"), "trial_end_step": trial.get("end_step"),
        "steps": {str(r): [[x["it"], x["n"], round_ms(x["compute_s"]), round_ms(x["sleep_s"]), round_ms(x["wait_s"]),
                            round_ms(x["other_s"]), round_ms(x["period_s"])] for x in recs[r]] for r in recs},
    }


def round_ms(x: float | None) -> float | None:
    return None if x is None else round(1e3 * x, 2)


def analyze(out: Path) -> dict[str, Any]:
    dirs = sorted(d for d in out.iterdir() if (d / "summary.json").exists() or (d / "run.json").exists())
    for d in dirs:
        if not RUN_NAME.fullmatch(d.name):
            raise ValueError(f"{d}: a run directory not named s<seed>-r<rep>-<{'|'.join(STRATEGIES)}>[-CODE]")
    runs = [analyze_run(d) for d in dirs if (d / "summary.json").exists()]
    failed = [d.name for d in dirs if not (d / "summary.json").exists()]
    runs.sort(key=lambda r: r["start"] or 0.0)
    for r in runs:
        seed, rep, r["strategy"], r["code_name"] = RUN_NAME.fullmatch(r["run"]).groups()
        r["pair"] = f"s{seed}-r{rep}"
    head = {"what": __doc__.split("\n")[0], "steps_columns": ["iteration", "local batch", "compute ms", "sleep ms",
                                                               "wait ms", "other ms", "period ms"]}
    if any(r["code_name"] for r in runs):
        return {**head, **analyze_ab(out, runs), "failed_runs": failed, "runs": runs}
    pairs = collections.defaultdict(dict)
    for r in runs:
        pairs[r["pair"]][r["strategy"]] = r
    ratios = {k: v["balanced"]["samples_per_s"] / v["equal"]["samples_per_s"]
              for k, v in sorted(pairs.items()) if {"balanced", "equal"} <= v.keys()}
    return {**head, "ratios": ratios, "failed_runs": failed, "summary": summarize(ratios, runs), "runs": runs}


def analyze_ab(out: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Two checkouts side by side (`run --code`): per pair (seed, rep) the second's balanced
    samples/s over the base's (the checkout the equal runs ran under), and each checkout's
    balanced runs against their seed's equal run (the reps of a seed share it, so the
    seed-clustered interval is the one whose pairs are independent); when each settled."""
    def root(r: dict[str, Any]) -> str:
        return read_run_meta(out / r["run"]).get("code_root", "")
    names = sorted({r["code_name"] for r in runs if r["code_name"]})
    equal = collections.defaultdict(list)
    for r in runs:
        if r["strategy"] == "equal":
            equal[r["pair"].split("-")[0]].append(r)
    base = {r["code_name"] for r in runs if r["code_name"] and root(r) in {root(e) for es in equal.values() for e in es}}
    if len(names) != 2 or any(r["strategy"] == "balanced" and not r["code_name"] for r in runs) or len(base) != 1:
        raise ValueError(f"{out}: expected balanced runs of two codes and equal runs under one of them, got codes "
                         f"{names} and equal under {sorted(base)}")
    a = base.pop()
    b = next(n for n in names if n != a)
    bal = {(r["code_name"], r["pair"]): r for r in runs if r["strategy"] == "balanced"}
    result: dict[str, Any] = {"base": a, "other": b, "codes": {n: sorted({r["code"] for r in runs if r["code_name"] == n})
                                                               for n in names},
                              "equal_code": sorted({e["code"] for es in equal.values() for e in es}),
                              "ratios": {}, "summary": {}, "settle": {}}
    for n in (a, b):
        ratios = {p: r["samples_per_s"] / geomean(e["samples_per_s"] for e in equal[p.split("-")[0]])
                  for (c, p), r in sorted(bal.items()) if c == n and equal[p.split("-")[0]]}
        result["ratios"][n] = ratios
        result["summary"][n] = summarize(ratios, [r for r in runs if r["code_name"] in (n, None)])
        last = [bal[k]["final_from_batch"] for k in sorted(bal) if k[0] == n]
        result["settle"][n] = {"last_change_batch": last, "median": statistics.median(last),
                               "at_or_after_60": sum(x >= 60 for x in last),
                               "reversals": [reversals(bal[k]["share_changes"]) for k in sorted(bal) if k[0] == n]}
    ab = {p: bal[(b, p)]["samples_per_s"] / bal[(a, p)]["samples_per_s"]
          for (c, p) in sorted(bal) if c == a and (b, p) in bal}
    result["ratios"][f"{b}/{a}"] = ab
    if len(ab) >= 2:
        mid, low, high = log_t_interval(ab.values())
        by_seed = collections.defaultdict(list)
        for p, v in ab.items():
            by_seed[p.split("-")[0]].append(v)
        result["ab"] = {"pairs": len(ab), "geomean": mid, "t95": [low, high], "faster": sum(v > 1 for v in ab.values()),
                        "by_seed": {k: geomean(v) for k, v in sorted(by_seed.items())}}
        if len(by_seed) >= 2:
            mid, low, high = log_t_interval(geomean(v) for v in by_seed.values())
            result["ab"]["seed_clustered"] = {"seeds": len(by_seed), "geomean": mid, "t95": [low, high]}
    return result


def reversals(changes: list[list[Any]]) -> int:
    """How often rank 0's share turned back (a move against the previous move's direction)."""
    moves = [b[1][0] - a[1][0] for a, b in zip(changes, changes[1:]) if b[1][0] != a[1][0]]
    return sum((x > 0) != (y > 0) for x, y in zip(moves, moves[1:]))


def summarize(ratios: dict[str, float], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per seed and pooled: the balanced/equal ratios (geometric means, a t interval over the
    pairs' log ratios and one clustered by seed, over the seeds' mean log ratios), how many reach
    1.3x, whether the seeds differ (one-way ANOVA on the log ratios), and the medians of the step
    split per strategy over the runs that kept backward overlap (forward overlap's split reads
    compute high and wait low; those runs are named, not counted)."""
    from scipy import stats as sstats
    by_seed: dict[str, list[float]] = collections.defaultdict(list)
    for key, v in ratios.items():
        by_seed[key.split("-")[0]].append(v)
    out: dict[str, Any] = {"by_seed": {k: {"ratios": v, "geomean": geomean(v),
                                           "at_least_1_3": sum(x >= 1.3 for x in v)} for k, v in sorted(by_seed.items())}}
    if len(ratios) >= 2:
        mid, low, high = log_t_interval(ratios.values())
        out["pooled"] = {"pairs": len(ratios), "geomean": mid, "t95": [low, high],
                         "at_least_1_3": sum(v >= 1.3 for v in ratios.values())}
    if len(by_seed) >= 2:  # the seeds' geometric means, each one sample of the ratio
        mid, low, high = log_t_interval(geomean(v) for v in by_seed.values())
        out["seed_clustered"] = {"seeds": len(by_seed), "geomean": mid, "t95": [low, high]}
    groups = [[math.log(x) for x in v] for v in by_seed.values() if len(v) >= 2]
    if len(groups) >= 2:
        out["seed_anova_p"] = float(sstats.f_oneway(*groups).pvalue)
    for tag in STRATEGIES:
        rs = [r for r in runs if r["strategy"] == tag]
        kept = [r for r in rs if r["overlap"] == "backward"]
        out[tag] = {"samples_per_s": [r["samples_per_s"] for r in rs],
                    "delay_per_sample_us": [round(1e6 * r["delay_per_sample_s"], 1) for r in rs],
                    "split_runs": len(kept), "split_left_out": [r["run"] for r in rs if r["overlap"] != "backward"],
                    **{f"rank{k}_{what}_ms": med([1e3 * r["per_rank_at_final_shares"][k][what] for r in kept
                                                  if r["per_rank_at_final_shares"][k][what] is not None])
                       for k in ("0", "1") for what in ("compute_s", "wait_s", "period_s")}}
    return out


def subnormals(seed: int) -> dict[str, int]:
    """Subnormal float32 entries over the command's 120 steps at equal shares, replayed in one
    process as `caramel train` cuts and seeds them (each rank's slice and dropout generator,
    gradients weighted n_r / B and summed): weights, gradients, AdamW moments, hidden
    activations. Subnormal arithmetic is the one way values could change a dense kernel's time."""
    import torch

    from caramel.data.share_sampler import ShareSampler, ShareSchedule
    from experiments.balance_seed_spread import WORLD, config
    from caramel.train.loop import lr_factor, make_optimizer
    from caramel.train.workloads import build_workload
    torch.set_num_threads(1)  # as each `caramel train` worker computes (torchrun's OMP_NUM_THREADS=1)
    tiny = torch.finfo(torch.float32).tiny

    def count(t: torch.Tensor) -> int:
        return int(((t != 0) & (t.abs() < tiny)).sum())
    cfg = config(seed)
    wl = build_workload(cfg)
    model, B = wl.model, WORLD * cfg.data.batch_size
    opt = make_optimizer(cfg, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(cfg, s))
    shares = ShareSchedule(B, WORLD, [cfg.data.batch_size] * WORLD)
    samplers = [ShareSampler(len(wl.train_set), shares, r, seed) for r in range(WORLD)]
    rngs = []
    for r in range(WORLD):
        torch.manual_seed(seed * 1000 + r + 1)
        rngs.append(torch.get_rng_state())
    totals = collections.Counter()
    for layer in model.hidden:
        layer.register_forward_hook(lambda m, a, out: totals.update(activations=count(out)))
    params = list(model.parameters())
    for step in range(cfg.run.steps):
        summed = [torch.zeros_like(p) for p in params]
        for r in range(WORLD):
            idx = torch.tensor(samplers[r].batch(step), dtype=torch.long)
            x, y = wl.train_set.batch(idx)
            torch.set_rng_state(rngs[r])
            model.zero_grad(set_to_none=True)
            wl.loss_fn(model(x), y).backward()
            rngs[r] = torch.get_rng_state()
            for t, p in zip(summed, params):
                t.add_(p.grad * (len(idx) / B))
        for t, p in zip(summed, params):
            p.grad = t
        totals.update(gradients=sum(count(p.grad) for p in params))
        opt.step()
        sched.step()
        totals.update(weights=sum(count(p) for p in params),
                      moments=sum(count(v) for st in opt.state.values() for k, v in st.items() if k.startswith("exp_avg")))
    return {k: totals[k] for k in ("weights", "gradients", "moments", "activations")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", type=int, nargs="+", required=True)
    r.add_argument("--reps", type=int, default=1)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--caramel", default=os.path.join(os.path.dirname(sys.executable), "caramel"))
    r.add_argument("--code", action="append", default=[], metavar="NAME=CHECKOUT",
                   help="twice: run the balanced command under each checkout (PYTHONPATH), side by side")
    n = sub.add_parser("subnormals")
    n.add_argument("--seeds", type=int, nargs="+", required=True)
    n.add_argument("--json", type=Path, help="also store the counts per seed here")
    a = sub.add_parser("analyze")
    a.add_argument("out", type=Path)
    a.add_argument("--json", type=Path)
    a.add_argument("--host", default="", help="what ran them (the bench lock, host load), stored in the JSON")
    args = ap.parse_args()
    if args.cmd == "subnormals":
        counts = {}
        for seed in args.seeds:
            counts[str(seed)] = subnormals(seed)
            print(f"seed {seed}: subnormal entries over the steps {counts[str(seed)]}", flush=True)
        if args.json:
            from caramel.bench.provenance import code_version
            write_json(args.json, {"format": "caramel.balance-seed-subnormals/1", "what": subnormals.__doc__.split("\n")[0],
                                   "command": "python -m experiments.balance_seed_steps subnormals --seeds "
                                   + " ".join(map(str, args.seeds)), "code": code_version(), "threads": 1,
                                   "subnormal_entries_by_seed": counts})
        return
    if args.cmd == "run":
        if args.reps < 1:
            raise SystemExit(f"--reps {args.reps}: expected at least 1")
        run_all(args.seeds, args.reps, args.out, args.caramel, parse_codes(args.code))
        return
    if not args.out.is_dir():
        raise SystemExit(f"{args.out}: not a directory of runs")
    try:
        result = analyze(args.out)
    except (ValueError, FormatError) as e:  # a foreign run folder or side file: one line naming it
        raise SystemExit(str(e)) from None
    if args.json:
        ab = "base" in result
        result = {"format": "caramel.balance-seed-steps-ab/1" if ab else "caramel.balance-seed-steps/2",
                  "command": "caramel " + " ".join(COMMAND)
                  + " --seed SEED --strategy STRATEGY (STRATEGY: " + ", ".join(STRATEGIES.values()) + ")"
                  + (" under PYTHONPATH and the working directory of each --code checkout" if ab else ""),
                  "host": args.host, **result}
        text = json.dumps(result, indent=1)
        # one line per step row and per short list: the file stays readable at 2 x 120 rows per run
        text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
        atomic_write_text(args.json, text + "\n")
    for run in result["runs"]:
        p = run["per_rank_at_final_shares"]
        print(f"{run['run']:22s} {run['samples_per_s']:6.0f}/s d {1e6 * run['delay_per_sample_s']:4.0f}us "
              f"shares {run['final_shares']} from {run['final_from_batch']:3d} "
              f"c0 {1e6 * (p['0']['compute_per_sample_s'] or 0):4.0f} c1 {1e6 * (p['1']['compute_per_sample_s'] or 0):4.0f} "
              f"slow {run['slowdown_in_run'] or 0:.2f} wait0 {1e3 * (p['0']['wait_s'] or 0):5.1f} "
              f"wait1 {1e3 * (p['1']['wait_s'] or 0):5.1f} other0 {1e3 * (p['0']['other_s'] or 0):5.1f} "
              f"opt0 {1e3 * (p['0']['optimizer_s'] or 0):5.1f} {run['trial_chosen']} {run['trial_end_step']}")
    groups = result["ratios"].items() if "base" in result else [("balanced/equal", result["ratios"])]
    for name, ratios in groups:
        for k, v in ratios.items():
            print(f"ratio {name} {k}: {v:.3f}")
    if "base" in result:
        for n, s in result["summary"].items():
            print(f"{n} vs equal: {json.dumps(s.get('pooled'))} seed-clustered {json.dumps(s.get('seed_clustered'))}; "
                  f"settle {json.dumps(result['settle'][n])}")
        print(f"{result['other']}/{result['base']}: {json.dumps(result.get('ab'))}")


if __name__ == "__main__":
    main()
