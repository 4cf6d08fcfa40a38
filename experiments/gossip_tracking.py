"""Collect the validation losses of `caramel train` runs into one JSON and a per-seed table
(docs/results/gossip.md, "Gradient tracking"): each run is OUT/NAME-SEED, its metrics.jsonl.

    for seed in 0 1 2 3 4; do for s in ddp gossip:topology=ring gossip:topology=ring,algorithm=tracking; do
      caramel train --workload digits --workers 4 --cluster off --val-every-steps 40 --seed $seed \\
          --strategy $s --out-dir runs/NAME-$seed --resume none     # NAME: ddp, ring, track
    done; done
    python experiments/gossip_tracking.py --runs runs --names ddp,ring,track --seeds 0,1,2,3,4 \\
        --json docs/results/gossip-tracking-digits.json
    python experiments/gossip_tracking.py --noise-model     # what each worker's optimizer sees
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def val_curve(run: Path) -> dict[int, float]:
    """step -> validation loss of one run (the last record of a step wins)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "val":
            out[int(rec["step"])] = float(rec["val_loss"])
    return out


def noise_model(workers: int = 4, steps: int = 200_000, seed: int = 0) -> dict[str, float]:
    """Per-coordinate variance of the gradient each worker's optimizer sees when every worker's
    gradient is pure noise of variance 1 (a quarter-batch's), on the ring (1/3 each): DDP's mean,
    the ATC tracker (mix after the correction, algorithm=tracking) and the CTA one (DSGT)."""
    rng = np.random.default_rng(seed)
    W = np.zeros((workers, workers))
    for i in range(workers):
        W[i, i] = W[i, (i + 1) % workers] = W[i, (i - 1) % workers] = 1 / 3
    atc, cta, g_prev = np.zeros(workers), np.zeros(workers), np.zeros(workers)
    seen_atc, seen_cta = [], []
    for t in range(steps):
        g = rng.standard_normal(workers)
        atc, cta, g_prev = W @ (atc + g - g_prev), W @ cta + g - g_prev, g
        if t >= 100:  # past the start-up
            seen_atc.append(atc.copy())
            seen_cta.append(cta.copy())
    return {"own_gradient": 1.0, "ddp_mean": 1 / workers, "tracking_atc": float(np.var(seen_atc)),
            "tracking_cta": float(np.var(seen_cta))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", help="folder holding NAME-SEED run folders")
    ap.add_argument("--names", help="run names joined by commas; the first is the baseline")
    ap.add_argument("--noise-model", action="store_true", help="print noise_model() and stop")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.noise_model:
        print(json.dumps(noise_model()))
        return
    if not args.runs or not args.names:
        ap.error("--runs and --names are needed (or --noise-model)")
    names, seeds = args.names.split(","), [int(s) for s in args.seeds.split(",")]
    curves = {n: {s: val_curve(Path(args.runs) / f"{n}-{s}") for s in seeds
                  if (Path(args.runs) / f"{n}-{s}" / "metrics.jsonl").exists()} for n in names}
    base = names[0]
    print("| seed | " + " | ".join(names) + " | " + " | ".join(f"{n} vs {base}" for n in names[1:]) + " |")
    print("|---" * (2 * len(names)) + "|")
    for s in seeds:
        final = {n: curves[n][s][max(curves[n][s])] if s in curves[n] else None for n in names}
        cells = [f"{final[n]:.4f}" if final[n] is not None else "-" for n in names]
        rel = [f"{(final[n] / final[base] - 1) * 100:+.1f}%" if final[n] is not None and final[base] else "-"
               for n in names[1:]]
        print(f"| {s} | " + " | ".join(cells + rel) + " |")
    if args.json:
        # a diverged run's NaN becomes null (strict JSON), listed under "diverged"
        val = {n: {str(s): {str(k): (v if math.isfinite(v) else None) for k, v in sorted(c.items())}
                   for s, c in curves[n].items()} for n in names}
        diverged = {n: [s for s, c in val[n].items() if None in c.values()] for n in names}
        Path(args.json).write_text(json.dumps({"baseline": base, "val_loss": val,
                                               "diverged": {n: d for n, d in diverged.items() if d}},
                                              indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
