"""Diagnose one seed's gap between ring gossip and DDP: consensus distance, each worker's
validation loss and the exact average's, check by check.

    python experiments/gossip_seed_diagnosis.py --runs /tmp/gsd --seeds 6,0 --json out.json

For each seed it runs (untimed, lowest CPU priority) `caramel train` with DDP and with the ring
(the seed study's flags, `--val-fraction 0.3`) and a checkpoint every `--every` steps, all kept;
then at each checkpoint of the ring run it computes the consensus distance (mean over workers of
the squared distance of its parameters to their exact average, summed over parameters), each
worker's validation loss and the loss of the exact parameter average (one all-reduce), beside
DDP's validation loss at the same step.

`caramel train --seed` sets model init, data order and dropout together. `--swap A:B` adds runs
with A's init and B's data order and dropout (folders ring-initA-B, ddp-initA-B): the child
processes load a `sitecustomize` (written into --runs) that seeds `build_workload`'s init with A;
nothing in the library changes. Each swapped run's log names the init seed it used.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.gossip_convergence import parse_seeds, train_run, val_loss  # noqa: E402
from experiments.gossip_tracking import val_curve  # noqa: E402

RING = "gossip:topology=ring,second_moment=debiased"


def configs(strategy: str, steps: int, every: int) -> dict[str, list[str]]:
    """The two runs per seed: DDP and the gossip strategy, checkpointed every `every` steps."""
    common = ["--val-fraction", "0.3", "--steps", str(steps), "--checkpoint-every", str(every),
              "--keep-last", str(steps // every + 1)]
    return {"ddp": ["--strategy", "ddp", *common], "ring": ["--strategy", strategy, *common]}


INIT_HOOK = """import os, sys
_seed = os.environ.get("GOSSIP_DIAGNOSIS_INIT_SEED")
if _seed is not None:
    import torch
    import caramel.train.workloads as _w

    def _build(cfg):
        torch.manual_seed(int(_seed))  # init from the swapped seed; data order and dropout keep --seed
        print(f"gossip_seed_diagnosis: model init seed {_seed}, run seed {cfg.run.seed}", file=sys.stderr, flush=True)
        return _w.WORKLOADS[cfg.run.workload](cfg)
    _w.build_workload = _build
"""


def parse_swap(text: str) -> tuple[int, int]:
    """'A:B' -> (init seed A, data seed B)."""
    a, sep, b = text.partition(":")
    if not (sep and a.isdigit() and b.isdigit()):
        raise SystemExit(f"--swap {text!r}: expected INIT_SEED:DATA_SEED, e.g. 0:6")
    return int(a), int(b)


def swapped_run(runs: Path, out: Path, flags: list[str], workload: str, workers: int, init: int, seed: int,
                every: int) -> None:
    """`train_run`'s command with the model init seeded by `init` (the hook in runs/_hook)."""
    hook = runs / "_hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(INIT_HOOK)
    env = {**os.environ, "GOSSIP_DIAGNOSIS_INIT_SEED": str(init),
           "PYTHONPATH": os.pathsep.join([str(hook), str(Path(__file__).resolve().parent.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = ["nice", "-n", "19", sys.executable, "-m", "caramel.cli", "train", "--workload", workload,
           "--workers", str(workers), "--cluster", "off", "--val-every-steps", str(every), "--seed", str(seed),
           "--out-dir", str(out), "--resume", "none", *flags]
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)


def consensus_sq(workers: list[dict[str, torch.Tensor]]) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean squared distance of the workers' floating parameters to their exact average, and the
    average itself (what one all-reduce of the parameters would give)."""
    avg = {k: torch.stack([w[k].double() for w in workers]).mean(0) if w0.is_floating_point() else w0
           for k, w0 in workers[0].items()}
    dist = statistics.fmean(sum(float((w[k].double() - avg[k]).pow(2).sum()) for k in avg
                                if workers[0][k].is_floating_point()) for w in workers)
    return dist, {k: v.to(workers[0][k].dtype) for k, v in avg.items()}


def checkpoint_rows(run: Path) -> list[dict[str, Any]]:
    """Per checkpoint of a gossip run: step, consensus distance, the checkpoint's own evaluation
    model, the exact average and every worker's validation loss."""
    from caramel.train import checkpoint as ckpt
    from caramel.train.config import TrainConfig, apply_dict
    from caramel.train.workloads import build_workload

    dirs = sorted(p for p in (run / "checkpoints").iterdir() if p.name.startswith("ckpt-"))
    if not dirs:
        raise SystemExit(f"{run}: no checkpoints; run without --analyze-only first")
    rows, wl, cfg = [], None, None
    for d in dirs:
        state = ckpt.load(d)
        if not state.get("gossip_workers"):
            raise SystemExit(f"{d}: holds no per-worker states (not a gossip run)")
        if wl is None:
            cfg = apply_dict(TrainConfig(), state["config"], str(d))
            wl = build_workload(cfg)

        def loss_of(weights: dict[str, torch.Tensor]) -> float:
            return val_loss(wl, cfg, weights)

        models = [w["model"] for w in state["gossip_workers"]]
        dist, avg = consensus_sq(models)
        norm = sum(float(v.double().pow(2).sum()) for k, v in avg.items() if v.is_floating_point())
        rows.append({"step": int(state["step"]), "consensus_sq": dist, "relative_consensus": dist / norm,
                     "eval_model": loss_of(state["model"]), "exact_average": loss_of(avg),
                     "workers": [loss_of(m) for m in models]})
    return rows


def final_sample_gap(ring: Path, ddp: Path, top: int = 10) -> dict[str, Any]:
    """Where the final checkpoints' validation losses differ: per-sample cross-entropy of the ring's
    exact average and of DDP's model, the share of the summed difference carried by the `top`
    samples that differ most, and both models' errors (a gap in confidence or in accuracy)."""
    from caramel.train import checkpoint as ckpt
    from caramel.train.config import TrainConfig, apply_dict
    from caramel.train.loop import VAL_MAX_SAMPLES
    from caramel.train.workloads import build_workload

    (r_dir, *_), (d_dir, *_) = ckpt.latest_valid(ring / "checkpoints"), ckpt.latest_valid(ddp / "checkpoints")
    r_state, d_state = ckpt.load(r_dir), ckpt.load(d_dir)
    cfg = apply_dict(TrainConfig(), r_state["config"], str(r_dir))
    wl = build_workload(cfg)
    idx = torch.arange(min(len(wl.val_set), VAL_MAX_SAMPLES))
    x, y = wl.val_set.batch(idx)
    y = y.reshape(-1)  # a sequence workload scores every position: one prediction each

    def per_sample(weights: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        wl.model.load_state_dict(weights)
        wl.model.eval()
        with torch.no_grad():
            logits = wl.model(x)
        logits = logits.reshape(-1, logits.shape[-1])
        return torch.nn.functional.cross_entropy(logits, y, reduction="none"), logits.argmax(-1) != y

    _, avg = consensus_sq([w["model"] for w in r_state["gossip_workers"]])
    r_loss, r_wrong = per_sample(avg)
    d_loss, d_wrong = per_sample(d_state["model"])
    diff = r_loss - d_loss
    order = diff.argsort(descending=True)
    return {"step": int(r_state["step"]), "ring_mean": float(r_loss.mean()), "ddp_mean": float(d_loss.mean()),
            "diff_sum": float(diff.sum()), "top": top, "top_diff_share": float(diff[order[:top]].sum() / diff.sum()),
            "top_samples": [{"index": int(i), "label": int(y[i]), "ring": float(r_loss[i]), "ddp": float(d_loss[i]),
                             "ring_wrong": bool(r_wrong[i]), "ddp_wrong": bool(d_wrong[i])}
                            for i in order[:top]],
            "ring_errors": int(r_wrong.sum()), "ddp_errors": int(d_wrong.sum()),
            "errors_both": int((r_wrong & d_wrong).sum())}


def late_train_loss(run: Path, after: int) -> float:
    """Mean logged training loss of the steps after `after` (the last quarter of a run)."""
    losses = [rec["loss"] for rec in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if rec.get("kind") == "train" and rec["step"] > after]
    return statistics.fmean(losses)


def diagnose(runs: Path, seed: int | str) -> dict[str, Any]:
    """One seed's rows (or a swap's, 'initA-B'): the ring's checkpoints beside DDP's validation curve."""
    ddp = val_curve(runs / f"ddp-{seed}")
    rows = checkpoint_rows(runs / f"ring-{seed}")
    for r in rows:
        base = ddp.get(r["step"])
        r["ddp"] = base
        r["gap_exact_average"] = None if base is None else r["exact_average"] / base - 1
        r["gap_best_worker"] = None if base is None else min(r["workers"]) / base - 1
    last = [r for r in rows[-4:] if r["ddp"] is not None]
    score = (statistics.fmean(r["exact_average"] for r in last) / statistics.fmean(r["ddp"] for r in last) - 1
             if last else None)
    after = rows[-1]["step"] * 3 // 4
    return {"seed": seed, "gap_last4": score, "train_loss_last_quarter": {
                name: late_train_loss(runs / f"{name}-{seed}", after) for name in ("ddp", "ring")},
            "ring_val_logged": {str(k): v for k, v in sorted(val_curve(runs / f"ring-{seed}").items())},
            "ddp_val": {str(k): v for k, v in sorted(ddp.items())}, "checkpoints": rows,
            "final_samples": final_sample_gap(runs / f"ring-{seed}", runs / f"ddp-{seed}")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="folder for the ddp-SEED and ring-SEED run folders")
    ap.add_argument("--seeds", default="6,0")
    ap.add_argument("--strategy", default=RING, help="the gossip strategy diagnosed")
    ap.add_argument("--workload", default="digits")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--every", type=int, default=20, help="checkpoint and validation interval (steps)")
    ap.add_argument("--swap", action="append", default=[],
                    help="INIT_SEED:DATA_SEED: also run both configurations with one seed's init and another's data order")
    ap.add_argument("--reuse", action="store_true", help="keep runs that finished (their summary.json exists)")
    ap.add_argument("--analyze-only", action="store_true", help="analyze the runs already in --runs")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.every < 1 or args.steps < args.every:
        raise SystemExit(f"--every {args.every}: expected a positive interval no longer than --steps {args.steps}")
    if not args.strategy.startswith("gossip"):
        raise SystemExit(f"--strategy {args.strategy!r}: expected a gossip strategy (gossip:...)")
    seeds, runs = parse_seeds(args.seeds), Path(args.runs)
    swaps = [parse_swap(t) for t in args.swap]
    runs.mkdir(parents=True, exist_ok=True)
    if not args.analyze_only:
        for seed in seeds:
            for name, flags in configs(args.strategy, args.steps, args.every).items():
                if args.reuse and (runs / f"{name}-{seed}" / "summary.json").exists():
                    continue
                print(f"seed {seed}: {name}", flush=True)
                train_run(runs / f"{name}-{seed}", flags, args.workload, args.workers, seed, args.every)
        for init, seed in swaps:
            for name, flags in configs(args.strategy, args.steps, args.every).items():
                if args.reuse and (runs / f"{name}-init{init}-{seed}" / "summary.json").exists():
                    continue
                print(f"init {init}, data {seed}: {name}", flush=True)
                swapped_run(runs, runs / f"{name}-init{init}-{seed}", flags, args.workload, args.workers, init, seed,
                            args.every)
    keys: list[int | str] = [*seeds, *(f"init{a}-{b}" for a, b in swaps)]
    result = {"format": "caramel.gossip-seed-diagnosis/1", "workload": args.workload, "workers": args.workers, "strategy": args.strategy, "steps": args.steps,
              "every": args.every, "seeds": [diagnose(runs, s) for s in keys]}
    for res in result["seeds"]:
        print(f"seed {res['seed']}: step, consensus^2 (rel), ddp, exact avg (gap), eval model, workers")
        for r in res["checkpoints"]:
            gap = "" if r["gap_exact_average"] is None else f" ({r['gap_exact_average'] * 100:+.1f}%)"
            print(f"  {r['step']:4d} {r['consensus_sq']:.3e} ({r['relative_consensus']:.1e}) {r['ddp'] or float('nan'):.4f} "
                  f"{r['exact_average']:.4f}{gap} {r['eval_model']:.4f} " + " ".join(f"{w:.4f}" for w in r["workers"]))
        if res["gap_last4"] is not None:
            print(f"  gap over the last 4 checks (the seed study's score): {res['gap_last4'] * 100:+.1f}%")
        tl = res["train_loss_last_quarter"]
        print(f"  training loss, last quarter: ddp {tl['ddp']:.4f}, ring {tl['ring']:.4f}")
        f = res["final_samples"]
        print(f"  final: ring {f['ring_mean']:.4f} vs ddp {f['ddp_mean']:.4f}; the {f['top']} samples that differ most carry "
              f"{f['top_diff_share']:.0%} of the difference; errors ring {f['ring_errors']}, ddp {f['ddp_errors']}, "
              f"both {f['errors_both']}")
    if args.json:
        from caramel.jsonio import write_json
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
