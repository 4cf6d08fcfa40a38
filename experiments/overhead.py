"""Per-step overhead of Caramel's engine over the plain PyTorch loop: one process, no communication.

Issue 2's target: with one process the engine costs at most 3% over the plain loop. Both loops
train their own identical copy of the model on the same batch, interleaved in rounds (so drift
of a shared machine hits both), one compute thread. Each block starts with an unmeasured step
and ends with `optimizer.synchronize()` (unmeasured) for caramel; a step is timed from the top
of the loop to the top of the next iteration, as in `caramel bench`.

    .venv/bin/python experiments/overhead.py                      # the default models
    .venv/bin/python experiments/overhead.py --model mlp --rounds 20 --json out.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import caramel  # noqa: E402
from caramel.bench.baselines import plain_step  # noqa: E402
from caramel.stats import median, percentile  # noqa: E402
from caramel.jsonio import format_tag, write_json  # noqa: E402
from caramel.models.zoo import get_model  # noqa: E402

# name, factory options: small models expose per-step overhead the most.
DEFAULT_MODELS = [("mlp", {}), ("resnet18", {"width": 16}), ("tiny_gpt", {}), ("gpt2", {"batch_size": 2})]
TARGET = 0.03


def _timed_block(step, steps: int, finish=None) -> list[float]:
    step()  # entry step, unmeasured
    times, t_prev = [], time.perf_counter()
    for _ in range(steps):
        step()
        t = time.perf_counter()
        times.append(t - t_prev)
        t_prev = t
    if finish is not None:
        finish()
    return times


def measure(name: str, options: dict, rounds: int, steps: int, planner: str, overlap: str) -> dict:
    """Interleaved per-step times of the plain loop and the caramel loop for one model."""
    factory = get_model(name)
    plain_w, car_w = factory(seed=0, **options), factory(seed=0, **options)
    plain_opt = torch.optim.SGD(plain_w.model.parameters(), lr=0.01, momentum=0.9)
    model, opt = caramel.parallelize(car_w.model, torch.optim.SGD(car_w.model.parameters(), lr=0.01, momentum=0.9),
                                     planner=planner, overlap=overlap)

    def plain():
        plain_step(plain_w.model, plain_opt, plain_w.inputs, plain_w.targets, plain_w.loss_fn)

    def car():
        plain_step(model, opt, car_w.inputs, car_w.targets, car_w.loss_fn)

    for _ in range(3):  # warm-up (the engine profiles and plans in its first steps)
        plain()
        car()
    opt.synchronize()
    times: dict[str, list[float]] = {"plain": [], "caramel": []}
    for r in range(rounds):
        order = ["plain", "caramel"] if r % 2 == 0 else ["caramel", "plain"]
        for which in order:
            if which == "plain":
                times["plain"] += _timed_block(plain, steps)
            else:
                times["caramel"] += _timed_block(car, steps, opt.synchronize)
    p, c = times["plain"], times["caramel"]
    return {
        "model": name, "options": options, "planner": planner, "overlap": overlap, "steps": len(p),
        "plain_median_s": median(p), "caramel_median_s": median(c),
        "plain_p90_s": percentile(p, 90), "caramel_p90_s": percentile(c, 90),
        "plain_mean_s": sum(p) / len(p), "caramel_mean_s": sum(c) / len(c),
        "overhead_median": median(c) / median(p) - 1.0,
        "overhead_mean": (sum(c) / len(c)) / (sum(p) / len(p)) - 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="zoo model (repeatable); default: " +
                    ", ".join(n for n, _ in DEFAULT_MODELS))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10, help="measured steps per loop per round")
    ap.add_argument("--planner", default="caramel")
    ap.add_argument("--overlap", default="forward")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    caramel.init_distributed()  # no torchrun environment: a one-process group
    models = [(m, {}) for m in args.model] if args.model else DEFAULT_MODELS
    rows = []
    print(f"{'model':<28} {'plain ms':>9} {'caramel ms':>11} {'overhead (median)':>18} {'overhead (mean)':>16}")
    for name, options in models:
        row = measure(name, options, args.rounds, args.steps, args.planner, args.overlap)
        rows.append(row)
        label = name + "".join(f",{k}={v}" for k, v in options.items())
        print(f"{label:<28} {1e3 * row['plain_median_s']:9.2f} {1e3 * row['caramel_median_s']:11.2f} "
              f"{row['overhead_median']:+17.1%} {row['overhead_mean']:+16.1%}", flush=True)
    worst = max(r["overhead_median"] for r in rows)
    verdict = "MET" if worst <= TARGET else "NOT MET"
    print(f"target: overhead <= {TARGET:.0%} on every model: {verdict} (worst median overhead {worst:+.1%}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if args.json:
        write_json(args.json, {"format": format_tag("overhead"), "rows": rows, "target": TARGET, "met": worst <= TARGET,
                               "torch": torch.__version__, "load_average": os.getloadavg()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
