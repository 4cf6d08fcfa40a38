"""SSP(2) and its staleness remedies against BSP with one slowed worker (issue 28's target).

    python experiments/ps_ssp_validation.py --workload char_gpt --steps 200 --seeds 0 1 2 \
        --json out.json   # run alone on the host: every spec of a seed in one run, in turn
    # the compensate spec chosen on a tuning run (lowest validation loss), added to --specs:
    python experiments/ps_ssp_validation.py ... --tune-json tune.json --json out.json
    # several runs into one results file (caramel.ps-ssp-validation/3):
    python experiments/ps_ssp_validation.py merge --tune tune.json --part char_gpt=out.json \
        --part digits=digits.json --meta meta.json --out results.json

For each seed, `caramel train` runs every `--specs` entry (the first is the reference, BSP)
with rank 1 1.5x slower (`--slow-worker 1:1.5`) on the emulated cluster at `--bandwidth`,
the same steps (so the same samples) and seed. Per run: the validation loss at the end and
throughput as world x batch / rank 0's mean step time over steps 6..end (metrics.jsonl; the
median flatters ssp, whose steps alternate short and blocked); per spec and seed, both as
ratios to the reference of the same seed. Each run also records what makes the losses
comparable, measured (the steps run and logged and the samples they trained on, validation
predictions, the first step's loss, rank 0's worker-side LR of every step), so a results file
shows that every spec of a seed matched there in these, and what the servers did (the run
summary's "ps": updates applied and pace waits per rank, lr_scaled, dc_corrected and dc_missing summed over the ranks,
each rank's [step, lag] per forward). Files before this change
(ps_ssp_validation_5) hold `samples_seen`, the configured steps x world x batch, instead, and no ps fields. `merge` adds nothing measured: the hand-written
fields (`--meta`: what, code, commands, host loads), the tuning run, every part's runs tagged
with its name, and each part's summary under "<part> <spec>".
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

SPECS = ["ps", "ps:consistency=ssp:2", "ps:consistency=ssp:2,staleness=pace",
         "ps:consistency=ssp:2,staleness=predict", "ps:consistency=ssp:2,staleness=compensate"]
FIRST_STEP = 6  # steps before this (profiling, warm-up) are left out of the mean step time


def train(workload: str, steps: int, seed: int, spec: str, bandwidth: str, out: Path) -> dict:
    argv = [sys.executable, "-m", "caramel.cli", "train", "--workload", workload, "--workers", "2", "--steps",
            str(steps), "--seed", str(seed), "--strategy", spec, "--slow-worker", "1:1.5", "--bandwidth", bandwidth,
            "--out-dir", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_rows = [r for r in rows if r.get("kind") == "train"]
    times = [r["step_time_s"] for r in train_rows if r["step"] >= FIRST_STEP]
    mean_step_s = statistics.mean(times)
    ps = s.get("ps") or {}
    return {"workload": workload, "strategy": spec, "seed": seed, "total_steps": s["total_steps"],
            "world_size": s["world_size"], "batch_size_per_worker": s["batch_size_per_worker"],
            "val_loss": s["val_loss"], "val_accuracy": s["val_accuracy"], "final_loss": s["final_loss"],
            "samples_per_s": s["samples_per_s"], "median_step_time_s": s["median_step_time_s"],
            "mean_step_time_s": mean_step_s,
            "samples_per_s_mean_step": s["world_size"] * s["batch_size_per_worker"] / mean_step_s,
            "staleness_mean": s.get("staleness_mean"), "wall_s": time.perf_counter() - t0,
            # what makes two specs' losses comparable, measured: the steps the loop ran (summary.json)
            # and logged (metrics.jsonl rows, x world x batch = the samples trained on), the
            # validation set, the first step (same initial model and batch) and the worker-side LR
            # per step (rank 0's scheduler). Not here: the LR the servers applied each update at
            # (tests/strategies/ps/test_staleness.py checks it on the engine)
            "end_step": s["end_step"], "finished": s["finished"], "steps_logged": len(train_rows),
            "samples_trained": len(train_rows) * s["world_size"] * s["batch_size_per_worker"],
            "val_predictions": s.get("val_predictions"), "first_step_loss": rows[0]["loss"] if rows else None,
            "lr_per_step": [r["lr"] for r in train_rows],
            # what the servers did (summary.json "ps"): updates applied per rank, scale's lr_scaled
            # and compensate's dc_corrected summed over the ranks, [step, lag] per forward per rank
            "updates_applied_per_rank": ps.get("updates_applied_per_rank"), "lr_scaled": ps.get("lr_scaled"),
            "dc_corrected": ps.get("dc_corrected"), "dc_missing": ps.get("dc_missing"),
            "pace_wait_s_per_rank": ps.get("pace_wait_s_per_rank"), "staleness_per_rank": ps.get("staleness_per_rank"),
            "load_after": os.getloadavg()}


def summarize(runs: list[dict], specs: list[str]) -> dict:
    out = {}
    seeds = sorted({r["seed"] for r in runs})
    by = {(r["strategy"], r["seed"]): r for r in runs}
    for spec in specs[1:]:
        loss = [by[(spec, s)]["val_loss"] / by[(specs[0], s)]["val_loss"] - 1 for s in seeds]
        thr = [by[(spec, s)]["samples_per_s_mean_step"] / by[(specs[0], s)]["samples_per_s_mean_step"] for s in seeds]
        ref_mean = statistics.mean(by[(specs[0], s)]["val_loss"] for s in seeds)
        out[spec] = {"seeds": seeds, "val_loss_vs_bsp_per_seed": [round(x, 4) for x in loss],
                     "val_loss_vs_bsp_of_seed_means": round(statistics.mean(by[(spec, s)]["val_loss"] for s in seeds)
                                                            / ref_mean - 1, 4),
                     "throughput_vs_bsp_mean_step_per_seed": [round(x, 3) for x in thr],
                     "staleness_mean": [by[(spec, s)]["staleness_mean"] for s in seeds],
                     "lr_scaled": [by[(spec, s)].get("lr_scaled") for s in seeds],
                     "dc_corrected": [by[(spec, s)].get("dc_corrected") for s in seeds]}
    return out


def choose(tune: dict) -> str:
    """The tuning run's compensate spec with the lowest validation loss (mean over its seeds)."""
    specs = [spec for spec in tune["specs"] if "staleness=compensate" in spec]
    if not specs:
        raise SystemExit("the tuning run has no staleness=compensate spec to choose from")
    return min(specs, key=lambda spec: statistics.mean(r["val_loss"] for r in tune["runs"] if r["strategy"] == spec))


def merge(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="ps_ssp_validation.py merge", description="runs into one results file")
    ap.add_argument("--tune", required=True, help="the tuning run's --json")
    ap.add_argument("--part", action="append", required=True, help="NAME=FILE: an evaluation run's --json")
    ap.add_argument("--meta", required=True, help="JSON of the hand-written fields (what, code, commands, ...)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tune = json.loads(Path(a.tune).read_text())
    result = {"format": "caramel.ps-ssp-validation/3", **json.loads(Path(a.meta).read_text()),
              "chosen_spec": choose(tune), "tune": {"summary": tune["summary"], "runs": tune["runs"]},
              "summary": {}, "runs": []}
    for item in a.part:
        name, _, file = item.partition("=")
        if not name or not file:
            raise SystemExit(f"--part must be NAME=FILE, got {item!r}")
        part = json.loads(Path(file).read_text())
        result["summary"].update({f"{name} {spec}": v for spec, v in summarize(part["runs"], part["specs"]).items()})
        result["runs"] += [{**r, "part": name} for r in part["runs"]]
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    if sys.argv[1:2] == ["merge"]:
        merge(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--specs", nargs="+", default=SPECS)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--tune-json", help="a tuning run's --json: its best compensate spec is added to --specs")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    chosen = None
    if a.tune_json:
        chosen = choose(json.loads(Path(a.tune_json).read_text()))
        a.specs = [*a.specs, chosen]
        print(f"chosen on {a.tune_json}: {chosen}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            for k, spec in enumerate(a.specs):
                r = train(a.workload, a.steps, seed, spec, a.bandwidth, Path(tmp) / f"{seed}-{k}")
                runs.append(r)
                print(f"{a.workload} seed {seed} {spec}: val loss {r['val_loss']:.4f}, "
                      f"{r['samples_per_s_mean_step']:.0f} samples/s (mean step), load {r['load_after'][0]:.1f}",
                      flush=True)
    result = {"workload": a.workload, "steps": a.steps, "bandwidth": a.bandwidth, "specs": a.specs,
              "chosen_spec": chosen, "summary": summarize(runs, a.specs), "runs": runs}
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
