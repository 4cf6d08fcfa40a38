"""DDRL against the small CNN on scikit-learn's digits, through `caramel train`, 1 to 4 workers.

    python -m experiments.ddrl_digits [--workers 1,2,4] [--steps 300] [--global-batch 64] [--json OUT]

Each point is one `caramel train --workload {ddrl,digits} --cluster off` run with the same
held-out 20% of the images, the same steps and the same global batch split across the
workers (so, by the sampler's design, every worker count trains on the same global batches).
For ddrl the workers first fit the feature hierarchy, each on its share of the training images,
merging statistics (`workload_info.ddrl_fit_s`); then only the MLP head trains. Reported: test
accuracy, fit seconds, training-loop seconds and samples/s per worker count. On a machine
with fewer cores than workers the workers share cores, which bounds what scaling can show, so
the fit's compute per rank is also timed in this process (CPU seconds of one thread, median of 3): the fit
on 1/W of the training images, the work each of W ranks does between merges.
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

import torch

from caramel.ddrl import DdrlExtractor
from caramel.jsonio import write_json
from caramel.train.data import digits_datasets


def train_run(workload: str, workers: int, steps: int, global_batch: int, seed: int, out: Path) -> dict:
    argv = [sys.executable, "-m", "caramel.cli", "train", "--workload", workload, "--workers", str(workers),
            "--cluster", "off", "--steps", str(steps), "--batch-size", str(global_batch // workers),
            "--val-fraction", "0.2", "--seed", str(seed), "--checkpoint-every", "0", "--out-dir", str(out),
            "--log-every-steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    info = s.get("workload_info") or {}
    return {"workload": workload, "workers": workers, "seed": seed, "steps": steps, "global_batch": global_batch,
            "test_accuracy": s["val_accuracy"], "test_samples": s["val_predictions"], "train_loop_s": s["wall_s"],
            "samples_per_s": s["samples_per_s"], "fit_s": info.get("ddrl_fit_s"),
            "fit_images_per_rank": info.get("ddrl_fit_images_per_rank"), "features": info.get("ddrl_features"),
            "command": " ".join(["caramel", *argv[3:-2]])}


def fit_per_rank_s(workers: int, repeats: int = 3) -> float:
    """Median CPU seconds of fitting the extractor on one rank's share (every `workers`-th image)."""
    images = digits_datasets(0.2)[0].inputs[::workers]
    times = []
    for _ in range(repeats):
        t0 = time.process_time()  # CPU time of one thread: the neighbours' load does not count
        DdrlExtractor.fit(images)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--workloads", default="ddrl,digits")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            for workers in (int(w) for w in args.workers.split(",")):
                if args.global_batch % workers:
                    raise SystemExit(f"--global-batch {args.global_batch} does not split across {workers} workers")
                for workload in args.workloads.split(","):
                    row = train_run(workload, workers, args.steps, args.global_batch, seed, Path(tmp) / f"{workload}-{workers}-{seed}")
                    rows.append(row)
                    fit = f", fit {row['fit_s']:.2f} s" if row["fit_s"] is not None else ""
                    print(f"{workload:6s} x{workers} seed {seed}: {100 * row['test_accuracy']:.2f}% "
                          f"({row['test_samples']} test images){fit}, loop {row['train_loop_s']:.1f} s, "
                          f"{row['samples_per_s']:.0f} samples/s", flush=True)
    torch.set_num_threads(1)
    fit = {}
    for workers in (int(w) for w in args.workers.split(",")):
        fit[str(workers)] = fit_per_rank_s(workers)
        print(f"fit compute per rank with {workers} worker(s): {fit[str(workers)]:.2f} s", flush=True)
    if args.json:
        write_json(args.json, {"format": "caramel.ddrl-digits/1", "rows": rows, "fit_per_rank_s": fit})


if __name__ == "__main__":
    main()
