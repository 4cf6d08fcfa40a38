"""What moves the validation loss of a `balance="batch"` run against equal shares, per seed.

`caramel train --workload digits ... --slow-worker 1:2` compares `caramel:balance=batch` with
`caramel:balance=batch,balance_every=0` (equal shares) at equal samples seen; one seed ended
13.4% apart (docs/results/adapt-train-balance-3.json). This replays the 2-worker training in
one process, step for step: each rank's slice of the share sampler's global batch, its own
dropout generator (seeded as `caramel train` seeds it), its mean loss's gradient weighted by
its share n_r / B, the two summed as the all-reduce sums them, then AdamW and the LR schedule
of the command. A replay of a recorded share schedule must reproduce the recorded loss; then
each input is moved alone, with nothing else changed:

- `replay`: the shares each recorded run used (equal shares included);
- `dropout`: equal shares, other dropout draws (the ranks' generators offset);
- `order`: equal shares, another epoch permutation (the sampler's seed offset; init unchanged);
- `--paired` (alone): the --results file's balanced shares of each seed and equal shares,
  both under the same other dropout draws, to compare draw for draw (`--side` splits the two
  over processes, `--first-draw` adds draws);
- `fixed-masks`: the recorded shares, but every sample's dropout mask drawn for its place in
  the global batch, whatever the cut: what remains between schedules is the arithmetic of the
  weighted sum (rounding), not which units each rank dropped.

    python experiments/balance_seed_spread.py --results docs/results/adapt-train-balance-3.json \
        --extra docs/results/adapt-train-balance.json docs/results/adapt-train-balance-2.json \
        --seeds 0 --draws 4 --json OUT
    python experiments/balance_seed_spread.py --results docs/results/adapt-train-balance-3.json \
        --seeds 0 1 2 3 4 --draws 4 --paired --json OUT
    python experiments/balance_seed_spread.py --summarize --json docs/results/adapt-balance-seed-spread.json

(docs/results/adapt-balance-seed-spread.json holds what these gave, gathered into one study file
tagged `caramel.balance-seed-spread/1`, the kind `--summarize` reads; a run writes its own,
`caramel.balance-seed-spread-run/1`; a run is ~10 s of one core.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn as nn

from caramel.data.share_sampler import ShareSampler, ShareSchedule
from caramel.errors import FormatError
from caramel.jsonio import format_tag, read_json, write_json
from caramel.stats import t_interval
from caramel.train.config import TrainConfig
from caramel.train.data import val_shard
from caramel.train.loop import VAL_MAX_SAMPLES, lr_factor, make_optimizer
from caramel.train.workloads import build_workload

WORLD = 2
OFFSET = 7919  # a prime: generator seeds offset by multiples of it meet no other run's
RUN_KIND = "balance-seed-spread-run"  # what one run (replays per seed, or --paired) writes
STUDY_KIND = "balance-seed-spread"  # the study's file the runs were gathered into, --summarize's input


class GlobalMaskDropout(nn.Module):
    """Dropout whose mask for each call is cut from one mask over the whole global batch, so a
    sample's mask depends on its place in the global batch and not on which rank computes it."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.masks, self.offset, self.call = p, [], 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        mask = self.masks[self.call][self.offset:self.offset + x.shape[0]]
        self.call += 1
        return x * mask / (1.0 - self.p)


def config(seed: int) -> TrainConfig:
    cfg = TrainConfig()
    cfg.run.workload, cfg.run.steps, cfg.run.seed = "digits", 120, seed
    cfg.data.batch_size, cfg.model.d_model = 128, 1024
    return cfg


def train_once(seed: int, schedule: list[tuple[int, list[int]]], dropout_offset: int = 0, order_offset: int = 0,
               fixed_masks: bool = False) -> float:
    """The validation loss after the command's 120 steps with these shares (see module docstring)."""
    cfg = config(seed)
    wl = build_workload(cfg)
    model, loss_fn = wl.model, wl.loss_fn
    opt = make_optimizer(cfg, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(cfg, s))
    B = WORLD * cfg.data.batch_size
    shares = ShareSchedule(B, WORLD, schedule[0][1])
    for start, counts in schedule[1:]:
        shares.change(counts, start)
    # the sampler seeds epoch e's permutation with seed + e: offsets far past the epochs run
    samplers = [ShareSampler(len(wl.train_set), shares, r, cfg.run.seed + 100_003 * order_offset) for r in range(WORLD)]
    rngs = []
    for r in range(WORLD):  # caramel train: torch.manual_seed(seed * 1000 + rank + 1) before the first step
        torch.manual_seed(cfg.run.seed * 1000 + r + 1 + OFFSET * dropout_offset)
        rngs.append(torch.get_rng_state())
    mask_gen = torch.Generator().manual_seed(cfg.run.seed * 1000 + OFFSET * dropout_offset)
    if fixed_masks:
        model.drop = GlobalMaskDropout(model.drop.p)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for step in range(cfg.run.steps):
        if fixed_masks:
            model.drop.masks = [(torch.rand(B, layer.out_features, generator=mask_gen) >= model.drop.p).float()
                                for layer in model.hidden]
        total = [torch.zeros_like(p) for p in params]
        offset = 0
        for r in range(WORLD):
            idx = torch.tensor(samplers[r].batch(step), dtype=torch.long)
            x, y = wl.train_set.batch(idx)
            torch.set_rng_state(rngs[r])
            if fixed_masks:
                model.drop.offset, model.drop.call = offset, 0
            model.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            rngs[r] = torch.get_rng_state()
            for t, p in zip(total, params):  # the engine scales each rank's flat gradient by n_r / B, then sums
                t.add_(p.grad * (len(idx) / B))
            offset += len(idx)
        for t, p in zip(total, params):
            p.grad = t
        opt.step()
        sched.step()
    return evaluate(model, wl, cfg.data.batch_size)


def evaluate(model: nn.Module, wl, batch_size: int) -> float:
    """`caramel.train.loop.evaluate`'s loss: both ranks' validation shards, summed."""
    model.eval()
    n = min(len(wl.val_set), VAL_MAX_SAMPLES)
    loss_sum, count = 0.0, 0
    with torch.no_grad():
        for r in range(WORLD):
            for idx in val_shard(n, WORLD, r).split(batch_size * 4):
                x, y = wl.val_set.batch(idx)
                loss_sum += float(wl.loss_fn(model(x), y)) * y.numel()
                count += y.numel()
    return loss_sum / count


def spread(values: list[float], base: float) -> dict[str, float]:
    rel = [100.0 * (v / base - 1.0) for v in values]
    return {"min_pct": min(rel), "max_pct": max(rel), "stdev_pct": statistics.stdev(rel) if len(rel) > 1 else 0.0}


BOOTSTRAP_RESAMPLES = 20000
BOOTSTRAP_SEED = 0


def summarize(pairs: dict[int, list[tuple[float, float]]]) -> dict:
    """The paired comparison's summary from (balanced, equal) validation losses per seed: each
    pair's balanced-vs-equal %, and the mean two ways: pairs pooled (a bootstrap of the mean,
    pairs resampled as if independent) and clustered by seed (the mean of the seed means with a
    t interval over the seeds: the pairs of a seed share init, epoch order and schedule)."""
    import random

    pct = {seed: [100.0 * (b / e - 1.0) for b, e in ps] for seed, ps in pairs.items()}
    pooled = [p for ps in pct.values() for p in ps]
    rng = random.Random(BOOTSTRAP_SEED)
    boot = sorted(statistics.fmean(rng.choices(pooled, k=len(pooled))) for _ in range(BOOTSTRAP_RESAMPLES))
    seed_means = [statistics.fmean(ps) for ps in pct.values()]
    mean, low, high = t_interval(seed_means)
    return {"balanced_vs_equal_pct": {str(k): v for k, v in pct.items()},
            "pairs": len(pooled), "mean_pct": statistics.fmean(pooled), "median_pct": statistics.median(pooled),
            "stdev_pct": statistics.stdev(pooled), "positive": sum(p > 0 for p in pooled),
            "pooled_bootstrap95": [boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]],
            "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED},
            "seed_means_pct": seed_means, "mean_of_seed_means_pct": mean,
            "seed_clustered_t95": [low, high]}


def summarize_file(path: str, first_draws: int | None = None) -> dict:
    """`summarize` of a results file's paired losses (its `paired` seeds, draw 0 the recorded run
    pair, plus `seed0_more_draws`); `first_draws`: only each seed's first so many pairs."""
    try:
        data = read_json(path, STUDY_KIND)
    except FormatError as e:
        raise SystemExit(str(e)) from None
    rows = data.get("paired", {}).get("seeds")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"seed", "balanced", "equal"} <= r.keys()
                                             for r in rows):
        raise SystemExit(f"{path}: expected a 'paired' entry whose 'seeds' list holds rows with 'seed', "
                         f"'balanced' and 'equal' (written by --paired runs)")
    pairs = {row["seed"]: list(zip(row["balanced"], row["equal"])) for row in rows}
    more = data.get("seed0_more_draws")
    if more is not None and 0 in pairs:
        pairs[0] += list(zip(more["balanced"], more["equal"]))
    if first_draws is not None:
        pairs = {k: v[:first_draws] for k, v in pairs.items()}
    if len(pairs) < 2 or any(not v for v in pairs.values()) or sum(map(len, pairs.values())) < 2:
        raise SystemExit(f"{path}: 'paired' needs at least 2 seeds, each with at least one (balanced, equal) "
                         f"pair, for the seed-clustered interval; it has {len(pairs)} seed(s) with "
                         f"{[len(v) for v in pairs.values()]} pairs")
    return summarize(pairs)


SUMMARY_NOTE = ("pooled_bootstrap95 here is reproducible (bootstrap: resamples, seed); the older "
                "mean_pct_bootstrap95 entries under 'paired' and 'seed0_more_draws' bootstrap the same "
                "pairs with an earlier, unrecorded resampling, so they differ in the second decimal")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", help="the recorded runs (adapt-train-balance JSON) whose schedules to replay "
                                      "(required, except with --summarize)")
    ap.add_argument("--extra", nargs="*", default=[], help="more recorded runs of the same command (their schedules too)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--draws", type=int, default=6, help="dropout draws and orders per seed (count)")
    ap.add_argument("--first-draw", type=int, default=1, help="the first draw's offset (more draws later: 1 + draws)")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--paired", action="store_true",
                    help="only the --results file's balanced schedule per seed and equal shares, each under the "
                         "other dropout draws (the same offsets for both), for a paired comparison")
    ap.add_argument("--side", choices=("both", "balanced", "equal"), default="both",
                    help="with --paired: which of the two to run (both; one, to split the work over processes)")
    ap.add_argument("--summarize", action="store_true",
                    help="only summarize the paired losses already in --json (every pair, and each seed's first "
                         "5), written into its 'summary' entry")
    args = ap.parse_args()
    if args.summarize:
        if args.results is not None or args.extra or args.paired:
            ap.error("--summarize reads only --json: --results, --extra and --paired are not used with it")
        summary = {"command": f"python experiments/balance_seed_spread.py --summarize --json {args.json}",
                   "note": SUMMARY_NOTE,
                   "all_pairs": summarize_file(args.json), "first_5_per_seed": summarize_file(args.json, 5)}
        try:
            data = read_json(args.json, STUDY_KIND)
        except FormatError as e:
            raise SystemExit(str(e)) from None
        data["summary"] = summary
        write_json(args.json, data)
        print(json.dumps({k: {kk: v[kk] for kk in ("pairs", "mean_pct", "pooled_bootstrap95", "mean_of_seed_means_pct",
                                                     "seed_clustered_t95")} for k, v in data["summary"].items()
                          if k not in ("command", "note")}, indent=1))
        return
    if args.results is None:
        ap.error("--results is required (except with --summarize)")
    torch.set_num_threads(1)
    recorded = []
    for path in [args.results] + args.extra:
        for run in json.load(open(path))["runs"]:
            recorded.append({"file": path, **{k: run[k] for k in ("seed", "strategy", "val_loss", "share_changes")}})
    out = {"command": "python experiments/balance_seed_spread.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()),
        "seeds": []}
    equal = [(0, [128, 128])]
    if args.paired:
        for seed in args.seeds:
            run = next(r for r in recorded if r["seed"] == seed and r["file"] == args.results
                       and r["share_changes"] != [[0, [128, 128]]])
            sched = [(int(s), list(c)) for s, c in run["share_changes"]]
            row = {"seed": seed, "shares": run["share_changes"]}
            for side, shares in (("balanced", sched), ("equal", equal)):
                if args.side in ("both", side):
                    row[f"{side}_other_dropout"] = [train_once(seed, shares, dropout_offset=k)
                                                    for k in range(args.first_draw, args.first_draw + args.draws)]
            out["seeds"].append(row)
            print(json.dumps(row), flush=True)
            write_json(args.json, {"format": format_tag(RUN_KIND), **out})
        return
    for seed in args.seeds:
        t0 = time.perf_counter()
        runs, seen = [], set()
        for r in recorded:  # each distinct schedule once (every equal-shares run has the same one)
            key = json.dumps(r["share_changes"])
            if r["seed"] == seed and key not in seen:
                seen.add(key)
                runs.append(r)
        replays = []
        for r in runs:
            sched = [(int(s), list(c)) for s, c in r["share_changes"]]
            replays.append({"file": r["file"], "strategy": r["strategy"], "shares": r["share_changes"],
                            "recorded_val_loss": r["val_loss"], "replayed_val_loss": train_once(seed, sched),
                            "fixed_masks_val_loss": train_once(seed, sched, fixed_masks=True)})
        base = train_once(seed, equal)
        dropout = [train_once(seed, equal, dropout_offset=k) for k in range(1, args.draws + 1)]
        order = [train_once(seed, equal, order_offset=k) for k in range(1, args.draws + 1)]
        fixed_base = train_once(seed, equal, fixed_masks=True)
        row = {"seed": seed, "equal_val_loss": base, "replays": replays,
               "equal_other_dropout": dropout, "equal_other_order": order,
               "dropout_spread": spread(dropout, base), "order_spread": spread(order, base),
               "fixed_masks_equal_val_loss": fixed_base,
               "fixed_masks_balanced_pct": [100.0 * (r["fixed_masks_val_loss"] / fixed_base - 1.0) for r in replays],
               "wall_s": time.perf_counter() - t0}
        out["seeds"].append(row)
        print(json.dumps({k: row[k] for k in ("seed", "equal_val_loss", "dropout_spread", "order_spread",
                                               "fixed_masks_balanced_pct", "wall_s")}), flush=True)
        for r in replays:
            print(f"  {r['strategy']:42s} recorded {r['recorded_val_loss']:.5f} replayed {r['replayed_val_loss']:.5f} "
                  f"fixed masks {r['fixed_masks_val_loss']:.5f}  {r['shares']}", flush=True)
        # after every seed: a long run leaves what it has done
        write_json(args.json, {"format": format_tag(RUN_KIND), **out})


if __name__ == "__main__":
    main()
