"""The compute cost of `cross_term=halves` per step, one worker's view, in one process (no
exchange: the option adds no bytes, so what it costs is the worker's own step).

Three variants on copies of one model, `caramel train`'s workload at its defaults (one worker's
batch): `own` (forward, backward, AdamW's step), `first_moment` (the same plus
`second_moment=debiased`'s estimator, `SecondMoment.observe` / `set_up`) and `halves` (two
half-batch forwards and backwards, the estimator's hooks, then the same). Rounds interleave the
variants in a rotating order; each round times `--steps` steps of each (after `--warmup`) and
keeps their median. Reported per workload: each variant's median step, and the ratios
halves / first_moment and halves / own per round, as a geometric mean with its 95% t interval
over rounds (`caramel.stats.log_t_interval`). One thread (a worker of a 4-worker run on this
host has about one core or less).

    python experiments/gossip_halves_cost.py --json docs/results/gossip-halves-cost.json   # run alone on the host
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from caramel.jsonio import format_tag, write_json  # noqa: E402
from caramel.stats import log_t_interval  # noqa: E402
from caramel.strategies.gossip.moments import SecondMoment  # noqa: E402
from caramel.train.config import TrainConfig, apply_dict  # noqa: E402
from caramel.train.workloads import build_workload  # noqa: E402

VARIANTS = ("own", "first_moment", "halves")


class Variant:
    """One model copy, its AdamW and (first_moment, halves) the estimator, stepping as GossipRun does."""

    def __init__(self, name: str, model: torch.nn.Module, loss_fn, world: int):
        self.name, self.model, self.loss_fn = name, copy.deepcopy(model), loss_fn
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        params = list(self.model.named_parameters())
        self.moments = None if name == "own" else SecondMoment(params, self.opt, world, name)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        t0 = time.perf_counter()
        if self.name == "halves":
            half = x.shape[0] // 2
            for part in (slice(0, half), slice(half, None)):
                (self.loss_fn(self.model(x[part]), y[part]) / 2).backward()
        else:
            self.loss_fn(self.model(x), y).backward()
        if self.moments is not None:
            self.moments.observe()
            self.moments.set_up()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def measure(workload: str, rounds: int, steps: int, warmup: int, world: int) -> dict:
    cfg = apply_dict(TrainConfig(), {"run": {"workload": workload, "seed": 0}}, "gossip_halves_cost")
    torch.manual_seed(0)
    wl = build_workload(cfg)
    wl.model.train()
    bs = cfg.data.batch_size
    variants = [Variant(name, wl.model, wl.loss_fn, world) for name in VARIANTS]
    gen = torch.Generator().manual_seed(0)
    n = len(wl.train_set)

    def batch():
        return wl.train_set.batch(torch.randint(0, n, (bs,), generator=gen))

    for v in variants:
        for _ in range(warmup):
            v.step(*batch())
    per_round: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            per_round[v.name].append(statistics.median(v.step(*batch()) for _ in range(steps)))
    out = {"workload": workload, "batch_size": bs, "parameters": sum(p.numel() for p in wl.model.parameters()),
           "median_step_ms": {k: 1e3 * statistics.median(vs) for k, vs in per_round.items()},
           "round_medians_ms": {k: [1e3 * x for x in vs] for k, vs in per_round.items()}}
    for ref in ("first_moment", "own"):
        g, lo, hi = log_t_interval([h / o for h, o in zip(per_round["halves"], per_round[ref])])
        out[f"halves_over_{ref}"] = {"geomean": g, "low": lo, "high": hi}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="digits,char_gpt")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant per round")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4, help="n in the estimator (its arithmetic only)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.rounds < 2 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("--rounds must be >= 2 (an interval over rounds), --steps >= 1, --warmup >= 0")
    torch.set_num_threads(1)
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    results = []
    for workload in args.workloads.split(","):
        res = measure(workload.strip(), args.rounds, args.steps, args.warmup, args.workers)
        results.append(res)
        ms = res["median_step_ms"]
        print(f"{res['workload']} (batch {res['batch_size']}, {res['parameters']:,} parameters): step ms "
              + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()), flush=True)
        for ref in ("first_moment", "own"):
            r = res[f"halves_over_{ref}"]
            print(f"  halves / {ref}: {r['geomean']:.3f} [{r['low']:.3f}, {r['high']:.3f}]", flush=True)
    if args.json:
        write_json(Path(args.json), {"format": format_tag("gossip-halves-cost"), "command": "python experiments/gossip_halves_cost.py " + " ".join(sys.argv[1:]),
                                     "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
                                     "threads": 1, "results": results,
                                     # 1/5/15-minute load averages: a loaded host widens the intervals
                                     "host_load": {"before": load_before, "after": Path("/proc/loadavg").read_text().split()[:3]
                                                   if Path("/proc/loadavg").exists() else None}})


if __name__ == "__main__":
    main()
