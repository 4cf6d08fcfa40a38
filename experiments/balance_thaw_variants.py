"""How frozen shares thaw, on the virtual clock (docs/results/adapt-history.md, "Frozen shares
that never thawed").

The settling rule freezes the shares after two decisions in a row keep them. The first rule
thawed them when a rank's own median compute drifted 15% from its value at the freeze, which
host load on both ranks trips and a lasting change between the ranks under 15% never does. This
compares, on the host-noise clock of `tests/strategies/adapt/balance_host_noise.py` (40 seeds,
120 steps, the costs of `test_balance_settle.py`), the controller without the rule, `--old`'s
(another checkout's balance.py: the drift rule), and the thaw on `THAW_DECISIONS` decisions in
a row proposing one move for 2 and 3 decisions and 10- and 20-step windows. Per variant: runs
changing the shares at batch 60 or later, runs turning back, runs within 3% of the ideal step by
step 60, the mean step over the ideal's; then, noise-free over 200 steps, a lasting change from
step 60 (one rank 1.12x, 0.88x or 1.5x; both 1.2x): the steps of the changes and the final
step over the ideal's.

    git show c71869e:caramel/strategies/caramel/balance.py > /tmp/balance_drift.py
    python -m experiments.balance_thaw_variants --old /tmp/balance_drift.py --json OUT

Deterministic: the noise is drawn from (seed, step, rank) and the ranks meet at a barrier.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from caramel.strategies.caramel import balance
from caramel.strategies.caramel.balance import WINDOW_STEPS, Balancer, counts_for_costs
from experiments.balance_clock_table import load_balancer
from tests.strategies.adapt.balance_clock import Clock, predicted_s, run
from tests.strategies.adapt.balance_host_noise import host_clock
from tests.strategies.adapt.test_balance_settle import COSTS_S, mean_excess, reversals, settled_from, trial_schedule

SEEDS = range(40)
LATE_BATCH = 60
LASTING = [(1, 1.12), (0, 0.88), (0, 1.5)]  # (rank, factor) from step 60 to the end


def host_noise(balancer_cls: type) -> dict[str, Any]:
    late = turned = near = 0
    excess = []
    for seed in SEEDS:
        res = run(host_clock(COSTS_S, 256, 120, seed), balancer_cls)
        changes = [c for c in res["changes"] if c["from_batch"] < 120]
        late += max([c["from_batch"] for c in changes], default=0) >= LATE_BATCH
        turned += reversals(changes) > 0
        s = settled_from(res["counts"], 0.03)
        near += s is not None and s <= LATE_BATCH
        excess.append(mean_excess(res["counts"]))
    return {"late": late, "turned": turned, "near_by_60": near, "mean_excess_pct": 100 * statistics.mean(excess)}


def lasting(balancer_cls: type) -> list[dict[str, Any]]:
    out = []
    for episodes in [[(60, 199, r, f)] for r, f in LASTING] + [[(60, 199, 0, 1.2), (60, 199, 1, 1.2)]]:
        res = run(Clock(COSTS_S, 256, 200, schedules=trial_schedule, episodes=episodes), balancer_cls)
        costs = [(a, b) for a, b in COSTS_S]
        for _, _, r, f in episodes:
            costs[r] = (costs[r][0] * f, costs[r][1] * f)
        best_s = predicted_s(costs, counts_for_costs(costs, 256))
        out.append({"episodes": episodes, "change_steps": [c["step"] for c in res["changes"]],
                    "final_excess_pct": 100 * (predicted_s(costs, res["counts"][-1]) / best_s - 1.0)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="another checkout's balance.py (the drift rule), shown beside")
    ap.add_argument("--json", type=Path, help="write the table here")
    args = ap.parse_args()

    class Previous(Balancer):
        hold_when_settled, window_steps = False, WINDOW_STEPS
    variants: list[tuple[str, type, int | None]] = [("previous (no settling rule)", Previous, None)]
    if args.old:
        variants.append(("drift 15% at 2 decisions (--old)", load_balancer(args.old), None))
    for thaw in (2, 3):
        for window in (20, 10):
            cls = type(f"Thaw{thaw}W{window}", (Balancer,), {"window_steps": window})
            variants.append((f"thaw at {thaw} in a row, {window}-step windows", cls, thaw))
    shipped = balance.THAW_DECISIONS
    rows = []
    try:
        for name, cls, thaw in variants:
            balance.THAW_DECISIONS = thaw if thaw is not None else shipped
            row = {"variant": name, **host_noise(cls), "lasting": lasting(cls)}
            rows.append(row)
            print(f"{name:42s} late {row['late']:2d} turned {row['turned']:2d} near {row['near_by_60']:2d} "
                  f"excess {row['mean_excess_pct']:.2f}%  lasting " + "; ".join(
                      f"{x['change_steps']} {x['final_excess_pct']:.1f}%" for x in row["lasting"]), flush=True)
    finally:
        balance.THAW_DECISIONS = shipped
    if args.json:
        args.json.write_text(json.dumps({"format": "caramel.balance-thaw-variants/1", "seeds": len(SEEDS),
                                         "steps": 120, "shipped_thaw_decisions": shipped, "old": args.old,
                                         "command": "python -m experiments.balance_thaw_variants " + " ".join(sys.argv[1:]),
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
