"""dlADMM against Adam on scikit-learn's digits, the same MLP at the same wall-clock budget.

    python -m experiments.admm_digits [--iterations 200,60] [--seeds 0,1,2] [--workers 2] [--json OUT]

Inputs are standardized with the training set's statistics; 20% of the images are held out
(`caramel.train.data.digits_datasets(0.2)`, the split every digits study here uses). For each
seed, dlADMM runs sweeps with the paper's backtracked updates (`solve=backtrack`, 200 by default)
and with exact W and a solves (`solve=exact`, 60); Adam then trains the same MLP (same initial
weights) on minibatches for as long as that dlADMM run took. Every curve point is (training
seconds, test accuracy), evaluation time excluded. The budget is this process's CPU time on one
thread (`time.process_time`), not wall-clock: on a machine shared with other jobs, wall time
measures the neighbours' load as much as the method (wall seconds are recorded too).

`--workers N` also runs the exact variant sharded over N gloo processes and reports how far its
weights are from the serial run's (they should agree to rounding).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from caramel.admm import AdmmOptions, DlAdmm, sharded_dladmm
from caramel.jsonio import write_json
from caramel.train.data import digits_datasets

HIDDEN = (128,)


def load() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    train, test = digits_datasets(0.2)
    x_tr, x_te = train.inputs.flatten(1).double(), test.inputs.flatten(1).double()
    mean, std = x_tr.mean(0), x_tr.std(0) + 0.1  # +0.1: constant border pixels stay finite
    return (x_tr - mean) / std, train.targets, (x_te - mean) / std, test.targets


def thin(curve: list[dict], points: int = 40) -> list[dict]:
    """At most `points` evenly spaced rows of a curve, the last one always kept (keeps the JSON small)."""
    if len(curve) <= points:
        return curve
    keep = sorted({round(i * (len(curve) - 1) / (points - 1)) for i in range(points)})
    return [curve[i] for i in keep]


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(1) == y).double().mean())


def run_admm(data, options: AdmmOptions) -> dict:
    x_tr, y_tr, x_te, y_te = data
    model = DlAdmm(x_tr, y_tr, 10, options)
    curve, clock, wall = [], 0.0, 0.0
    for it in range(options.iterations):
        t0, w0 = time.process_time(), time.perf_counter()
        model.iterate()
        clock += time.process_time() - t0
        wall += time.perf_counter() - w0
        m = model.measures()
        curve.append({"iteration": it + 1, "train_s": clock, "wall_s": wall, "test_accuracy": accuracy(model.predict(x_te), y_te),
                      "train_accuracy": accuracy(model.predict(x_tr), y_tr), **m})
    return {"options": {k: getattr(options, k) for k in options.__dataclass_fields__}, "curve": curve,
            "train_s": clock, "test_accuracy": curve[-1]["test_accuracy"], "model": model}


def run_adam(data, init: torch.nn.Sequential, budget_s: float, lr: float, batch: int, seed: int) -> dict:
    """Adam on minibatches of the same MLP from the same weights until `budget_s` of training."""
    x_tr, y_tr, x_te, y_te = data
    model = init
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    curve, clock, wall, steps = [], 0.0, 0.0, 0
    while clock < budget_s:
        t0, w0 = time.process_time(), time.perf_counter()
        for idx in torch.randperm(len(x_tr), generator=g).split(batch):  # one epoch
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        clock += time.process_time() - t0
        wall += time.perf_counter() - w0
        with torch.no_grad():
            curve.append({"epoch": len(curve) + 1, "steps": steps, "train_s": clock, "wall_s": wall,
                          "test_accuracy": accuracy(model(x_te), y_te), "train_accuracy": accuracy(model(x_tr), y_tr)})
    return {"lr": lr, "batch": batch, "curve": curve, "train_s": clock, "test_accuracy": curve[-1]["test_accuracy"]}


def _sharded_worker(rank: int, world: int, data, options: AdmmOptions) -> dict:
    x_tr, y_tr, x_te, y_te = data
    t0 = time.perf_counter()
    model = sharded_dladmm(x_tr, y_tr, 10, options)
    for _ in range(options.iterations):
        model.iterate()
    # plain lists: tensors would travel as shared-memory handles that die with this process
    return {"train_s": time.perf_counter() - t0, "W": [w.tolist() for w in model.W], "b": [b.tolist() for b in model.b],
            "test_accuracy": accuracy(model.predict(x_te), y_te)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", default="200,60", help="sweeps of solve=backtrack and of solve=exact")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--nu", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--adam-lr", type=float, default=1e-3)
    ap.add_argument("--adam-batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="also run the exact variant sharded over N gloo processes")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = load()
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        iterations = dict(zip(("backtrack", "exact"), (int(i) for i in args.iterations.split(",", 1))))
        if len(iterations) != 2 or min(iterations.values()) < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--iterations {args.iterations!r}: expected two positive counts, backtrack,exact (e.g. 200,60)") from None
    runs = []
    for seed in seeds:
        for solve in ("backtrack", "exact"):
            opts = AdmmOptions(hidden=HIDDEN, rho=args.rho, nu=args.nu, weight_decay=args.weight_decay,
                               iterations=iterations[solve], solve=solve, seed=seed)
            admm = run_admm(data, opts)
            init = DlAdmm(data[0][:10], data[1][:10], 10, opts).to_module()  # the same initial weights
            adam = run_adam(data, init, admm["train_s"], args.adam_lr, args.adam_batch, seed)
            del admm["model"]
            admm["curve"], adam["curve"] = thin(admm["curve"]), thin(adam["curve"])
            runs.append({"seed": seed, "solve": solve, "dladmm": admm, "adam": adam})
            print(f"seed {seed} {solve:9s}: dlADMM {100 * admm['test_accuracy']:.2f}% in {admm['train_s']:.1f} CPU s "
                  f"({iterations[solve]} iterations); Adam {100 * adam['test_accuracy']:.2f}% in {adam['train_s']:.1f} CPU s "
                  f"({adam['curve'][-1]['steps']} steps)", flush=True)
    summary = {}
    for solve in ("backtrack", "exact"):
        mine = [r for r in runs if r["solve"] == solve]
        summary[solve] = {
            "dladmm_test_accuracy_mean": statistics.mean(r["dladmm"]["test_accuracy"] for r in mine),
            "adam_test_accuracy_mean": statistics.mean(r["adam"]["test_accuracy"] for r in mine),
            "train_s_mean": statistics.mean(r["dladmm"]["train_s"] for r in mine),
        }
        s = summary[solve]
        s["gap_points"] = 100 * (s["adam_test_accuracy_mean"] - s["dladmm_test_accuracy_mean"])
        print(f"{solve:9s}: dlADMM {100 * s['dladmm_test_accuracy_mean']:.2f}% vs Adam {100 * s['adam_test_accuracy_mean']:.2f}% "
              f"(gap {s['gap_points']:.2f} points) at {s['train_s_mean']:.1f} CPU s", flush=True)
    sharded = None
    if args.workers > 1:
        from caramel.testing import run_workers
        opts = AdmmOptions(hidden=HIDDEN, rho=args.rho, nu=args.nu, weight_decay=args.weight_decay,
                           iterations=iterations["exact"], solve="exact", seed=seeds[0])
        serial = DlAdmm(data[0], data[1], 10, opts)
        t0 = time.perf_counter()
        for _ in range(opts.iterations):
            serial.iterate()
        serial_s = time.perf_counter() - t0
        out = run_workers(_sharded_worker, args.workers, args=(data, opts), timeout_s=1200, collective_timeout_s=120)
        diff = max(float((torch.tensor(w, dtype=torch.float64) - v).abs().max())
                   for w, v in zip(out[0]["W"] + out[0]["b"], serial.W + serial.b))
        sharded = {"workers": args.workers, "solve": "exact", "seed": seeds[0], "serial_train_s": serial_s,
                   "sharded_train_s": max(o["train_s"] for o in out), "max_abs_weight_diff": diff,
                   "serial_test_accuracy": accuracy(serial.predict(data[2]), data[3]),
                   "sharded_test_accuracy": out[0]["test_accuracy"]}
        print(f"sharded over {args.workers} ranks: max |W - W_serial| = {diff:.2e}; {sharded['sharded_train_s']:.1f} s "
              f"vs serial {serial_s:.1f} s", flush=True)
    if args.json:
        write_json(args.json, {"format": "caramel.admm-digits/1", "hidden": list(HIDDEN), "test_samples": len(data[3]),
                               "iterations": iterations, "summary": summary, "runs": runs, "sharded": sharded})


if __name__ == "__main__":
    main()
