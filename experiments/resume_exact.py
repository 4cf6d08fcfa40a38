"""Does `caramel train` resume bit for bit? One run straight through, one resumed from its checkpoint.

    python experiments/resume_exact.py --strategy caramel:compression=topk:0.1,overlap=forward \
        --json docs/results/resume-exact.json

For each `--strategy`: `caramel train` runs `--steps` steps with a checkpoint every `--half`
steps; a second run starts from that run's step-`--half` checkpoint (`--resume PATH`, its own
output directory) and runs to the end. The report compares the second run's losses with the
first's at the same steps, and the final checkpoints' model tensors.

Resuming from the straight run's own checkpoint, rather than stopping a separate run with
`--stop-after-steps`, keeps the plan out of the comparison: two runs each profile and plan from
their own timings, so their plans (and, with a codec that works per bucket, their losses) can
differ before any stop.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TRAIN = ["--cluster", "off", "--workload", "digits", "--workers", "2", "--batch-size", "32", "--warmup-steps", "2",
         "--lr", "0.01"]


def _train(strategy: str, steps: int, half: int, out: Path, resume: str = "none") -> None:
    argv = [sys.executable, "-m", "caramel.cli", "train", *TRAIN, "--steps", str(steps), "--checkpoint-every",
            str(half), "--strategy", strategy, "--out-dir", str(out), "--resume", resume]
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def _losses(out: Path) -> dict[int, float]:
    lines = (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip())
    return {d["step"]: d["loss"] for d in lines if d.get("kind") == "train"}


def _model(out: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoints" / f"ckpt-{step:09d}" / "state.pt", weights_only=True)["model"]


def compare(strategy: str, steps: int, half: int, root: Path) -> dict:
    straight, resumed = root / "straight", root / "resumed"
    _train(strategy, steps, half, straight)
    ckpt = root / f"ckpt-{half}"  # a copy: the straight run keeps only its newest checkpoints
    shutil.copytree(straight / "checkpoints" / f"ckpt-{half:09d}", ckpt)
    saved = torch.load(ckpt / "state.pt", weights_only=True)["optimizer"].get("caramel_adaptive") or {}
    _train(strategy, steps, half, resumed, resume=str(ckpt))
    a, b = _losses(straight), _losses(resumed)
    ma, mb = _model(straight, steps), _model(resumed, steps)
    diffs = {s: abs(a[s] - b[s]) for s in b}
    # caramel: whether the checkpoint held the settled plan (none while profiling or in the trial)
    return {"strategy": strategy, "steps": steps, "resumed_at": half, "plan_in_checkpoint": "plan" in saved,
            "losses_straight": [a[s] for s in sorted(b)],
            "losses_resumed": [b[s] for s in sorted(b)], "max_loss_diff": max(diffs.values()),
            "steps_differing": [s for s, d in diffs.items() if d != 0.0],
            "params_equal": all(torch.equal(ma[k], mb[k]) for k in ma),
            "max_param_diff": max(float((ma[k].double() - mb[k].double()).abs().max()) for k in ma)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", action="append", required=True, help="a --strategy of caramel train (repeatable)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--half", type=int, default=8, help="the checkpoint the second run resumes from (step)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for strategy in args.strategy:
        with tempfile.TemporaryDirectory() as tmp:
            row = compare(strategy, args.steps, args.half, Path(tmp))
        print(f"{strategy}: max loss difference {row['max_loss_diff']:g} over steps {args.half + 1}..{args.steps}, "
              f"plan {'in' if row['plan_in_checkpoint'] else 'not in'} the checkpoint, "
              f"final parameters {'equal' if row['params_equal'] else 'differ by %g' % row['max_param_diff']}", flush=True)
        rows.append(row)
    if args.json is not None:
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
