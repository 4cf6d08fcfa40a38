"""Run and score gossip's convergence against DDP in one command: `caramel train` for every
configuration and seed, then the validation loss at the last step against each configuration's
baseline, and (gossip runs) every worker's own model beside the workers' average
(docs/results/gossip.md, "Which model, which optimizer").

    python experiments/gossip_convergence.py --runs runs/conv --seeds 0,1,2,3,4 \\
        --config ddp=ddp --config ring=gossip:topology=ring \\
        --config sgd_ddp="ddp --optimizer sgd --momentum 0.9 --lr 0.05" \\
        --config sgd_ring="gossip:topology=ring --optimizer sgd --momentum 0.9 --lr 0.05" \\
        --vs sgd_ring=sgd_ddp --json docs/results/gossip-convergence-digits.json

A configuration is NAME=STRATEGY followed by extra `caramel train` flags; each is scored against
the first configuration unless `--vs NAME=BASE` says otherwise. `--score-last N` scores each run
by the mean of its last N validation checks instead of the final one (a single check on a small
held-out set swings by more than the 5% rule; docs/results/gossip-seeds.md), with the mean gap's
95% interval over seeds and each configuration's gap to itself on other seeds. `caramel train` logs the
validation loss of the workers' averaged model (docs/gossip.md); the final checkpoint holds each
worker's own model, which this script evaluates on the same validation samples, so the two rules
(x-bar, or one worker's model) are compared on the same runs.

`--stored NAME=JSON` takes NAME's validation curves from an earlier results file of this script
instead of running it again (a reference whose run folders are gone); any NAME-SEED run in
`--runs` must reproduce the stored curve bit for bit, else the script stops, and at least one
must exist (`--require-reproduced SEEDS`: those seeds' runs; `--stored-unverified` scores curves
that no run here reproduces, recorded as such). The validation settings are written into the
JSON and checked against a stored file's. `--paired A=B` reports A's per-seed gap minus B's
(same baseline) with its interval over seeds.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from caramel.stats import t_interval  # noqa: E402
from experiments.gossip_tracking import val_curve  # noqa: E402

WITHIN = 0.05  # the target: within 5% of DDP's validation loss


def parse_config(spec: str) -> tuple[str, list[str]]:
    """'NAME=STRATEGY [flags...]' -> (NAME, ['--strategy', STRATEGY, flags...])."""
    name, sep, rest = spec.partition("=")
    words = shlex.split(rest)
    if not sep or not name or not words:
        raise SystemExit(f"--config {spec!r}: expected NAME=STRATEGY [caramel train flags], e.g. ring=gossip:topology=ring")
    return name, ["--strategy", words[0], *words[1:]]


def train_run(out: Path, flags: list[str], workload: str, workers: int, seed: int, val_every: int) -> None:
    """One `caramel train` run at the lowest CPU priority (convergence runs are not timed)."""
    cmd = ["nice", "-n", "19", sys.executable, "-m", "caramel.cli", "train", "--workload", workload,
           "--workers", str(workers), "--cluster", "off", "--val-every-steps", str(val_every), "--seed", str(seed),
           "--out-dir", str(out), "--resume", "none", *flags]
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())


def evaluate_workers(run: Path) -> dict[str, Any] | None:
    """Validation loss of the final checkpoint's averaged model and of each worker's own model,
    computed here as `caramel train`'s evaluate does (every validation sample once, loss per
    prediction); None for runs that hold no per-worker states (DDP)."""
    from caramel.train import checkpoint as ckpt
    from caramel.train.config import TrainConfig, apply_dict
    from caramel.train.workloads import build_workload

    found = ckpt.latest_valid(run / "checkpoints")
    if not found:
        return None
    state = ckpt.load(found[0])
    if not state.get("gossip_workers"):
        return None
    cfg = apply_dict(TrainConfig(), state["config"], str(found[0]))
    wl = build_workload(cfg)

    def loss_of(weights: dict[str, torch.Tensor]) -> float:
        return val_loss(wl, cfg, weights)

    return {"step": int(state["step"]), "averaged": loss_of(state["model"]),
            "workers": [loss_of(w["model"]) for w in state["gossip_workers"]]}


def val_loss(wl, cfg, weights: dict[str, torch.Tensor]) -> float:
    """The mean validation loss of `weights` in workload `wl` (built from the run's TrainConfig
    `cfg`) over its first `VAL_MAX_SAMPLES` held-out samples, in batches of 4x the batch size."""
    from caramel.train.loop import VAL_MAX_SAMPLES

    n = min(len(wl.val_set), VAL_MAX_SAMPLES)
    wl.model.load_state_dict(weights)
    wl.model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for idx in torch.arange(n).split(cfg.data.batch_size * 4):
            x, y = wl.val_set.batch(idx)
            total += float(wl.loss_fn(wl.model(x), y)) * y.numel()
            count += y.numel()
    return total / count


def mean_interval(values: list[float], confidence: float = 0.95) -> list[float] | None:
    """The mean's Student-t interval over seeds (each seed one independent sample); None for
    fewer than two values."""
    if len(values) < 2:
        return None
    _, low, high = t_interval(values, confidence)
    return [low, high]


def score(final: dict[str, dict[int, float]], baseline: dict[str, str]) -> dict[str, Any]:
    """Per configuration: each seed's loss relative to its baseline's on the same seed, the mean
    with its 95% interval over seeds, and on how many seeds it is within WITHIN: `within` counts
    no worse than WITHIN above the baseline (the issue's rule), `within_both` |gap| <= WITHIN."""
    out = {}
    for name, base in baseline.items():
        rel = {s: final[name][s] / final[base][s] - 1 for s in sorted(final[name]) if s in final.get(base, {})}
        out[name] = {"vs": base, "relative": rel, "mean": statistics.fmean(rel.values()) if rel else None,
                     "interval95": mean_interval(list(rel.values())),
                     "within": sum(r <= WITHIN for r in rel.values()),
                     "within_both": sum(abs(r) <= WITHIN for r in rel.values()), "seeds": len(rel)}
    return out


def seed_spread(losses: dict[int, float]) -> dict[str, Any]:
    """One configuration against itself on other seeds: every ordered pair of distinct seeds'
    relative gap (loss_s / loss_s' - 1), how many are within WITHIN above (the issue's rule) and
    within WITHIN either way. Two runs of the same algorithm differ only by seed here, so this is
    what the score reads when nothing else differs (an upper bound for paired seeds, which share
    the initial model and the data order)."""
    rel = [losses[a] / losses[b] - 1 for a in losses for b in losses if a != b]
    return {"pairs": len(rel), "within": sum(r <= WITHIN for r in rel), "within_both": sum(abs(r) <= WITHIN for r in rel),
            "sd": statistics.stdev(rel) if len(rel) > 1 else None}


def load_stored(spec: str, workload: str, workers: int, seeds: list[int],
                validation: dict[str, int]) -> tuple[str, str, dict[int, dict[int, float]], float | None]:
    """'NAME=JSON' -> (NAME, its flags as stored, seed -> step -> validation loss, its runs'
    validation fraction or None where unrecorded) from an earlier results file of this script; the
    file must be of the same workload and worker count, hold every requested seed and NAME's flags,
    and (where it records them; older files do not) have the same check interval and sample cap as
    `validation`, else an error naming the file."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--stored {spec!r}: expected NAME=JSON, e.g. ddp=docs/results/gossip-seeds-gpt.json")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--stored {spec!r}: cannot read {path} as JSON ({e})") from None
    if (data.get("workload"), data.get("workers")) != (workload, workers):
        raise SystemExit(f"--stored {spec!r}: {path} is {data.get('workload')} on {data.get('workers')} workers, "
                         f"expected {workload} on {workers} (--workload/--workers)")
    per = data.get("val_loss", {}).get(name)
    if per is None:
        raise SystemExit(f"--stored {spec!r}: {path} has no configuration {name!r} "
                         f"(it has {', '.join(data.get('val_loss', {})) or 'none'})")
    missing = [s for s in seeds if str(s) not in per]
    if missing:
        raise SystemExit(f"--stored {spec!r}: {path} has no run of {name} for seeds {missing}")
    flags = data.get("configs", {}).get(name)
    if flags is None:
        raise SystemExit(f"--stored {spec!r}: {path} has validation curves for {name!r} but no configs[{name!r}] "
                         "(its caramel train flags); expected a results file written by this script")
    stored_val = data.get("validation") or {}
    differ = {k: (stored_val[k], v) for k, v in validation.items() if k in stored_val and stored_val[k] != v}
    if differ:
        raise SystemExit(f"--stored {spec!r}: {path} differs in its validation settings (stored, here): {differ} "
                         "(--val-every-steps, caramel.train.loop.VAL_MAX_SAMPLES)")
    curves = {s: {int(k): float(v) for k, v in per[str(s)].items()} for s in seeds}
    return name, flags, curves, (stored_val.get("val_fraction") or {}).get(name)


def run_val_fraction(run: Path) -> float | None:
    """The validation fraction a `caramel train` run used (the config.json it writes for its
    workers, caramel.train-config/1), None if unrecorded."""
    try:
        return json.loads((run / "config.json").read_text())["config"]["data"]["val_fraction"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_reproduced(name: str, stored: dict[int, dict[int, float]], runs: Path, seeds: list[int],
                     val_fraction: float | None = None) -> list[int]:
    """The seeds whose NAME-SEED run in `runs` reproduces the stored curve exactly (every check,
    every bit); a run that differs anywhere, or was held out with another validation fraction than
    the stored runs' (where both are recorded), stops the script, naming the run and the first
    check that differs (a reference reused from another code version must be the same computation)."""
    checked = []
    for s in seeds:
        if not (runs / f"{name}-{s}" / "metrics.jsonl").exists():
            continue
        frac = run_val_fraction(runs / f"{name}-{s}")
        if None not in (frac, val_fraction) and frac != val_fraction:
            raise SystemExit(f"{name}-{s} in {runs} held out {frac} of the data for validation, the stored runs "
                             f"{val_fraction}; run the reference with the stored flags")
        got = val_curve(runs / f"{name}-{s}")
        for k in sorted(set(got) | set(stored[s])):
            if got.get(k) != stored[s].get(k):
                raise SystemExit(f"{name}-{s} in {runs} does not reproduce the stored curve: step {k} reads "
                                 f"{got.get(k)!r}, stored {stored[s].get(k)!r}; run the reference again instead")
        checked.append(s)
    return checked


def require_reproduced(reproduced: dict[str, list[int]], required: list[int] | None, unverified: bool) -> None:
    """The rule for reusing stored curves: every seed in `required` (--require-reproduced) has a
    run here that reproduced them, or, without that list, at least one seed did; a stored reference
    that no run reproduces is refused unless `unverified` (--stored-unverified) says to score it
    anyway (the JSON then records `reproduced_seeds: []`)."""
    for name, got in reproduced.items():
        if required is not None:
            short = [s for s in required if s not in got]
            if short:
                raise SystemExit(f"--require-reproduced: no run {', '.join(f'{name}-{s}' for s in short)} in --runs "
                                 f"reproduces the stored {name} curves (reproduced: {got or 'none'}); run them here first")
        elif not got and not unverified:
            raise SystemExit(f"--stored {name}: no {name}-SEED run in --runs reproduces the stored curves, so nothing "
                             "shows this code and host compute them; run one seed of it here with the stored flags "
                             "(it must match bit for bit), or pass --stored-unverified to score them anyway")


def paired(scores: dict[str, Any], spec: str) -> dict[str, Any]:
    """'A=B' -> A's gap minus B's gap per seed (both against the same baseline), their mean and
    95% t interval over the seeds both have."""
    a, _, b = spec.partition("=")
    if a not in scores or b not in scores:
        raise SystemExit(f"--paired {spec!r}: both names must be scored configurations ({', '.join(scores)})")
    if scores[a]["vs"] != scores[b]["vs"]:
        raise SystemExit(f"--paired {spec!r}: {a} is scored against {scores[a]['vs']}, {b} against {scores[b]['vs']}")
    diff = {s: scores[a]["relative"][s] - scores[b]["relative"][s]
            for s in scores[a]["relative"] if s in scores[b]["relative"]}
    return {"a": a, "b": b, "vs": scores[a]["vs"], "difference": diff,
            "mean": statistics.fmean(diff.values()) if diff else None, "interval95": mean_interval(list(diff.values())),
            "a_higher": sum(d > 0 for d in diff.values()), "seeds": len(diff)}


def parse_seeds(text: str, option: str = "--seeds") -> list[int]:
    """'0,1,2' -> [0, 1, 2]; anything else is an error naming the option and the input."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise SystemExit(f"{option} {text!r}: expected comma-separated integers, e.g. 0,1,2") from None


def resolve_baselines(names: list[str], vs: list[str]) -> dict[str, str]:
    """Each configuration but the first -> its baseline (the first, or NAME=BASE from --vs). A
    baseline keeps its own score against its own baseline (chains such as ring -> ddp_lr_half ->
    ddp); a configuration cannot be its own baseline."""
    baseline = {n: names[0] for n in names[1:]}
    for v in vs:
        n, _, b = v.partition("=")
        if n not in names or b not in names:
            raise SystemExit(f"--vs {v!r}: both names must be configurations ({', '.join(names)})")
        if n == b:
            raise SystemExit(f"--vs {v!r}: a configuration cannot be its own baseline")
        baseline[n] = b
    return baseline


def final_losses(curves: dict[str, dict[int, dict[int, float]]], last: int = 1) -> dict[str, dict[int, float]]:
    """Each run's validation loss over its `last` logged checks, averaged (1: the final check
    alone); every run must end at the same step, else a run cut short would be compared with its
    baseline at an earlier step, and every run must have the same `last` check steps, else two
    runs' averages would cover different parts of training."""
    if last < 1:
        raise SystemExit(f"--score-last {last}: expected a positive number of validation checks")
    ends = {(n, s): max(c) for n, per in curves.items() for s, c in per.items() if c}
    if len(set(ends.values())) > 1:
        end = max(ends.values())
        short = ", ".join(f"{n}-{s} (step {k})" for (n, s), k in sorted(ends.items()) if k != end)
        raise SystemExit(f"runs end at different steps: {short} stop before step {end}; rerun them")
    windows = {(n, s): tuple(sorted(c)[-last:]) for n, per in curves.items() for s, c in per.items() if c}
    for (n, s), w in sorted(windows.items()):
        if len(w) < last or w != next(iter(windows.values())):
            raise SystemExit(f"--score-last {last}: run {n}-{s} has checks at steps {list(w)}, "
                             f"others at {list(next(iter(windows.values())))}; use runs with the same --val-every-steps")
    return {n: {s: statistics.fmean(c[k] for k in windows[n, s]) for s, c in per.items() if c}
            for n, per in curves.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="folder for the NAME-SEED run folders")
    ap.add_argument("--config", action="append", required=True, help="NAME=STRATEGY [caramel train flags]")
    ap.add_argument("--vs", action="append", default=[],
                    help="NAME=BASE: score NAME against BASE (default: the first config); BASE keeps its own score")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--workload", default="digits")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--val-every-steps", type=int, default=40)
    ap.add_argument("--score-last", type=int, default=1,
                    help="score each run by the mean of its last N validation checks (1: the final check alone)")
    ap.add_argument("--collect-only", action="store_true", help="score the runs already in --runs")
    ap.add_argument("--reuse", action="store_true", help="keep runs that finished (their summary.json exists)")
    ap.add_argument("--stored", action="append", default=[],
                    help="NAME=JSON: NAME's validation curves from an earlier results file of this script, not run again")
    ap.add_argument("--require-reproduced", default=None, metavar="SEEDS",
                    help="with --stored: these seeds' runs in --runs must reproduce the stored curves (default: one seed)")
    ap.add_argument("--stored-unverified", action="store_true",
                    help="with --stored: score stored curves that no run here reproduces (recorded as such)")
    ap.add_argument("--paired", action="append", default=[], help="A=B: A's per-seed gap minus B's, with its interval")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    configs = dict(parse_config(c) for c in args.config)
    seeds = parse_seeds(args.seeds)
    from caramel.train.loop import VAL_MAX_SAMPLES

    validation = {"every_steps": args.val_every_steps, "max_samples": VAL_MAX_SAMPLES}
    required = None if args.require_reproduced is None else parse_seeds(args.require_reproduced, "--require-reproduced")
    if (required is not None or args.stored_unverified) and not args.stored:
        raise SystemExit("--require-reproduced/--stored-unverified: only with --stored NAME=JSON")
    if required is not None and args.stored_unverified:
        raise SystemExit("--require-reproduced and --stored-unverified: give one or the other")
    stored = {n: (flags, c, frac) for n, flags, c, frac in
              (load_stored(x, args.workload, args.workers, seeds, validation) for x in args.stored)}
    clash = sorted(set(stored) & set(configs))
    if clash:
        raise SystemExit(f"--stored {', '.join(clash)}: also given as --config; a configuration is run or stored, not both")
    names = list(configs) + list(stored)
    baseline = resolve_baselines(names, args.vs)
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    if not args.collect_only:
        for seed in seeds:
            for name, flags in configs.items():
                if args.reuse and (runs / f"{name}-{seed}" / "summary.json").exists():
                    print(f"seed {seed}: {name} (kept)", flush=True)
                    continue
                print(f"seed {seed}: {name}", flush=True)
                train_run(runs / f"{name}-{seed}", flags, args.workload, args.workers, seed, args.val_every_steps)
    reproduced = {n: check_reproduced(n, c, runs, seeds, frac) for n, (_, c, frac) in stored.items()}
    require_reproduced(reproduced, required, args.stored_unverified)
    for n, checked in reproduced.items():
        print(f"{n}: stored curves used; runs here reproduce them exactly on seeds {checked or 'none (unverified)'}")
    curves = {n: {s: val_curve(runs / f"{n}-{s}") for s in seeds if (runs / f"{n}-{s}" / "metrics.jsonl").exists()}
              for n in configs}
    curves.update({n: c for n, (_, c, _) in stored.items()})
    fractions = {n: run_val_fraction(runs / f"{n}-{min(curves[n])}") for n in configs if curves[n]}
    fractions.update({n: frac for n, (_, _, frac) in stored.items()})
    final = final_losses(curves, args.score_last)
    own = {n: {s: evaluate_workers(runs / f"{n}-{s}") for s in final[n]} if n in configs else {} for n in names}
    scores = score(final, baseline)
    pairs = [paired(scores, p) for p in args.paired]
    last_check = final_losses(curves)
    at_end = score(last_check, baseline)
    spread = {n: seed_spread(final[n]) for n in names if len(final[n]) > 1}
    print("| seed | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
    for s in seeds:
        cells = []
        for n in names:
            v = final[n].get(s)
            rel = scores.get(n, {}).get("relative", {}).get(s)
            cells.append("-" if v is None else f"{v:.4f}" + (f" ({rel * 100:+.1f}%)" if rel is not None else ""))
        print(f"| {s} | " + " | ".join(cells) + " |")
    for n, sc in scores.items():
        if sc["seeds"]:
            ci = "" if sc["interval95"] is None else " [{:+.1f}%, {:+.1f}%]".format(*(x * 100 for x in sc["interval95"]))
            print(f"{n} vs {sc['vs']}: mean {sc['mean'] * 100:+.1f}%{ci}, within {WITHIN:.0%} on {sc['within']} of "
                  f"{sc['seeds']} seeds (|gap| within on {sc['within_both']})")
    for p in pairs:
        ci = "" if p["interval95"] is None else " [{:+.1f}, {:+.1f}]".format(*(x * 100 for x in p["interval95"]))
        print(f"{p['a']} - {p['b']} (gaps to {p['vs']}): mean {p['mean'] * 100:+.1f} points{ci}, "
              f"{p['a']} higher on {p['a_higher']} of {p['seeds']} seeds")
    for n, sp in spread.items():
        print(f"{n} against itself on other seeds: within {WITHIN:.0%} on {sp['within']} of {sp['pairs']} ordered pairs "
              f"(|gap| within on {sp['within_both']}), SD of the gap {sp['sd'] * 100:.1f} points")
    for n in names:
        for s, e in own[n].items():
            if e:
                print(f"{n}-{s}: averaged {e['averaged']:.4f} (logged {last_check[n][s]:.4f}); workers' own "
                      + ", ".join(f"{w:.4f}" for w in e["workers"]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "workload": args.workload, "workers": args.workers,
            "configs": {**{n: " ".join(f) for n, f in configs.items()}, **{n: f for n, (f, _, _) in stored.items()}},
            "validation": {**validation, "val_fraction": fractions},
            "stored": {n: {"from": x.partition("=")[2], "reproduced_seeds": reproduced[n],
                           "required_seeds": required, "unverified_allowed": args.stored_unverified}
                       for n, x in ((x.partition("=")[0], x) for x in args.stored)},
            "baseline": baseline, "val_loss": {n: {str(s): {str(k): v for k, v in sorted(c.items())}
                                                     for s, c in curves[n].items()} for n in names},
            "score_last": args.score_last,
            "scores": {n: {**sc, "relative": {str(s): r for s, r in sc["relative"].items()}} for n, sc in scores.items()},
            "scores_final_check": {n: {**sc, "relative": {str(s): r for s, r in sc["relative"].items()}}
                                   for n, sc in at_end.items()},
            "seed_spread": spread,
            "paired": [{**p, "difference": {str(s): d for s, d in p["difference"].items()}} for p in pairs],
            "own_models": {n: {str(s): e for s, e in per.items() if e} for n, per in own.items()},
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
