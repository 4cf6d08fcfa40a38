"""What `balance="dropout"` adds to a step when nothing is dropped: one process, no communication.

Times, interleaved in rounds on the same model and batch (one compute thread):
- `plain`: forward + backward + SGD step of the zoo model;
- `wrapped`: the same with `Narrowing`'s forwards installed on every droppable layer and no
  unit dropped (what every step paid before the fast path: the wrappers ran at fraction 0);
- `seeded_draw`: the per-step mask draw for `--world` ranks at fraction 0 as it ran before the
  fast path (a hash and a generator per rank and group, every step), and `draw_now`:
  `DropoutBalancer._draw` as it runs now at fraction 0 (on a stand-in engine);
- `gather`: the decision's all-gather, once per `balance_every` steps, measured apart by the
  2-process bench (not here: one process has no peer).

    PYTHONPATH=. .venv/bin/python experiments/dropout_idle_overhead.py --model mlp --rounds 20 \
        --json docs/results/adapt-dropout-idle-overhead.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from caramel.jsonio import write_json  # noqa: E402
from caramel.models.zoo import get_model  # noqa: E402
from caramel.profile.dropout_groups import Narrowing, find_groups  # noqa: E402
from caramel.profile.dropout_table import DropoutTable  # noqa: E402
from caramel.strategies.caramel.dropout import DropoutBalancer, kept_units  # noqa: E402
from caramel.runtime.stats import EngineStats  # noqa: E402


class _StandInEngine:
    """What `DropoutBalancer` reads of an engine, without one."""

    def __init__(self, params):
        self.params, self.stats, self.reduce_fixup = params, EngineStats(), None

    def add_listeners(self, **_):
        pass


def _step_fn(mb):
    opt = torch.optim.SGD(mb.model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        mb.loss_fn(mb.model(mb.inputs), mb.targets).backward()
        opt.step()
    return step


def _block(fn, steps: int) -> list[float]:
    fn()  # entry call, unmeasured
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the medians here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    plain, wrapped = get_model(args.model)(), get_model(args.model)()
    groups = find_groups(wrapped.model)
    narrowing = Narrowing(groups)  # installed, nothing dropped: what every step ran before
    narrowing.set_kept({})
    idle = get_model(args.model)()
    table = DropoutTable.from_dict({"format": "caramel.dropout-table/1", "model": args.model,
                                    "groups": [g.name for g in find_groups(idle.model)],
                                    "entries": [{"fraction": 0.0, "time_ratio": 1.0, "val_loss": 1.0, "loss_increase": 0.0}]})
    idle_groups = find_groups(idle.model)
    balancer = DropoutBalancer(_StandInEngine(list(idle.model.parameters())), idle.model, None, 0, args.world, 10,
                               table, idle_groups)
    steps = {"plain": _step_fn(plain), "wrapped": _step_fn(wrapped)}

    counter = [0]

    def seeded_draw():  # what every step ran at fraction 0 before the fast path
        counter[0] += 1
        for gi, g in enumerate(groups):
            [kept_units(0, counter[0], r, gi, g.units, 0.0) for r in range(args.world)]
    times: dict[str, list[float]] = {"plain": [], "wrapped": [], "seeded_draw": [], "draw_now": []}
    for r in range(args.rounds):
        names = ["plain", "wrapped"] if r % 2 == 0 else ["wrapped", "plain"]
        for n in names:
            times[n] += _block(steps[n], args.steps)
        times["seeded_draw"] += _block(seeded_draw, args.steps)
        times["draw_now"] += _block(balancer._draw, args.steps)
    assert not balancer.narrowing.installed  # nothing dropped: the layers' own forwards
    med = {n: statistics.median(t) for n, t in times.items()}
    base = med["plain"]
    print(f"{args.model}: {len(groups)} groups, world {args.world}, {args.rounds} x {args.steps} steps")
    for n, m in med.items():
        if n == "plain":
            print(f"  plain        {1e3 * m:8.3f} ms per step (median)")
        elif n == "wrapped":
            print(f"  wrapped      {1e3 * m:8.3f} ms per step ({100 * (m - base) / base:+.2f}% vs plain)")
        else:
            print(f"  {n:12s} {1e6 * m:8.1f} us per step ({100 * m / base:.3f}% of a plain step)")
    if args.json:
        out = {"format": "caramel.dropout-idle-overhead/1", "model": args.model, "groups": len(groups),
               "world": args.world, "rounds": args.rounds, "steps": args.steps, "torch": torch.__version__,
               "median_s": med, "wrapped_vs_plain": med["wrapped"] / base - 1.0}
        write_json(args.json, out)

if __name__ == "__main__":
    main()
