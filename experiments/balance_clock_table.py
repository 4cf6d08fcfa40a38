"""The virtual-clock table of `balance="batch"` (docs/results/adapt-history.md, run 9's section).

Every rank's `Balancer` runs on the virtual clock of `tests/strategies/adapt/balance_clock.py`
with the costs and trial schedule of `test_balance_settle.py`, in three scenarios of slow first
steps (forward overlap hiding half of a rank's wait, a warm-up, slow spells of either rank) at
3%, 8% and 15% step noise, 16 seeds each. Per cell: the mean over seeds of the mean step over the
ideal's from step 10; then per scenario the runs with a swing (a move followed by one the other
way) and the runs ending more than 2% over the ideal step, at 15% noise and with slow spells at
3%. `--old FILE` runs another controller's balance.py beside this checkout's (`old -> new`):

    git show 306d162:caramel/strategies/caramel/balance.py > /tmp/balance_old.py
    python -m experiments.balance_clock_table --old /tmp/balance_old.py

Deterministic: the noise is drawn from (seed, step, rank) and the ranks meet at a barrier.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Any

from caramel.strategies.caramel.balance import Balancer, counts_for_costs
from tests.strategies.adapt.balance_clock import Clock, predicted_s, run
from tests.strategies.adapt.test_balance_settle import COSTS_S, FORWARD_READS, reversals, trial_schedule

SCENARIOS = {
    "forward overlap hiding half of rank 0's wait": {"reads_wait_as_compute": FORWARD_READS},
    "rank 0 1.4x for its first 10 steps (warm-up)": {"episodes": [(5, 14, 0, 1.4)]},
    "rank 0 1.3x over steps 5-12 and 40-49, rank 1 1.2x over 80-86":
        {"episodes": [(5, 12, 0, 1.3), (40, 49, 0, 1.3), (80, 86, 1, 1.2)]},
}
NOISES = (0.03, 0.08, 0.15)
SEEDS = 16
SKIP_STEPS = 10  # the first decision's steps: equal shares for every controller


def load_balancer(path: str) -> type:
    """The `Balancer` of another checkout's balance.py, as its own module (the clock swaps its `dist`)."""
    spec = importlib.util.spec_from_file_location("balance_other", path)
    if spec is None or not Path(path).is_file():
        raise SystemExit(f"--old {path}: not a balance.py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Balancer


def cell(balancer_cls: type, noise: float, kw: dict[str, Any]) -> dict[str, float]:
    """Over `SEEDS` runs: the mean excess step from step 10, the runs with a swing, the runs
    ending more than 2% over the ideal step."""
    best = predicted_s(COSTS_S, counts_for_costs(COSTS_S, 256))
    excess, swung, off = [], 0, 0
    for seed in range(SEEDS):
        res = run(Clock(COSTS_S, 256, 120, schedules=trial_schedule, noise=noise, seed=seed, **kw), balancer_cls)
        excess.append(statistics.mean(predicted_s(COSTS_S, c) / best - 1.0 for c in res["counts"][SKIP_STEPS:]))
        swung += reversals(res["changes"]) > 0
        off += predicted_s(COSTS_S, res["counts"][-1]) > best * 1.02
    return {"excess": statistics.mean(excess), "swung": swung, "off": off}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", help="another controller's balance.py, shown as old -> this checkout's")
    args = ap.parse_args()
    controllers = ([load_balancer(args.old)] if args.old else []) + [Balancer]
    cells = {(name, noise): [cell(b, noise, kw) for b in controllers]
             for name, kw in SCENARIOS.items() for noise in NOISES}
    print("| first steps slow by | " + " | ".join(f"{100 * n:.0f}% step noise" for n in NOISES) + " |")
    print("|---" * (len(NOISES) + 1) + "|")
    for name in SCENARIOS:
        row = [" -> ".join(f"{100 * c['excess']:.1f}%" for c in cells[(name, n)]) for n in NOISES]
        print(f"| {name} | " + " | ".join(row) + " |")
    for what, label in (("swung", "runs with a swing"), ("off", "runs ending over 2% from the ideal")):
        at15 = " / ".join(" -> ".join(str(c[what]) for c in cells[(name, 0.15)]) for name in SCENARIOS)
        spell3 = " -> ".join(str(c[what]) for c in cells[(list(SCENARIOS)[-1], 0.03)])
        print(f"{label}, of {SEEDS}: at 15% noise {at15} (the three rows); slow spells at 3% noise {spell3}")


if __name__ == "__main__":
    main()
