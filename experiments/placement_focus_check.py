"""Does the policy's choice of layers guide the local search? On (validation) instances, the
saved round policy's greedy placement searched three ways: every layer from the first pass
(the plain search), the fraction F of the layers the policy was least sure of first
(`decode_rounds(focus=F)`), and a random F of the layers first (the control: the two-phase
search without the policy's choice). Untimed: passes, moves and the cost against the plain
search per instance (mean with a 95% t interval, wins, losses).

    python -m experiments.placement_focus_check --load-policy policy.pt --ppo width=64 \
        --seeds 100:120 --fractions 0.03,0.05,0.1,0.2 --json out.json
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from caramel.jsonio import format_tag, write_json
from caramel.sched.placement import InstanceOptions, random_instance
from caramel.sched.placement.decode import Decoded, Decoding
from caramel.sched.placement.fast_decode import NumpyPolicy
from caramel.sched.placement.local_search import SearchOptions, local_search
from caramel.sched.placement.round_env import RoundPlacementEnv
from caramel.sched.placement.rounds import decode_rounds
from caramel.sched.rl import PpoOptions
from caramel.stats import t_interval
from experiments.placement_policy_file import load_policy
from experiments.rl_common import options_from, parse_fractions, seed_range


def random_focus(inst, fraction: float, seed: int) -> np.ndarray:
    """(T, L) bool: round(F x layers) layers drawn at random (seeded), at least one."""
    lengths = np.array([len(t.gflop) for t in inst.tasks])
    valid = np.arange(lengths.max())[None, :] < lengths[:, None]
    cells = np.flatnonzero(valid)
    mask = np.zeros(valid.size, dtype=bool)
    mask[np.random.default_rng(seed).choice(cells, max(1, int(round(fraction * cells.size))), replace=False)] = True
    return mask.reshape(valid.shape)


def random_focus_search(decode_plain, plain_row: str, fraction: float, options: SearchOptions, decoded: dict,
                        seed: int):
    """`edge_placement`'s control of a guided search (row `ppo+random:F`): the policy's greedy
    placement (`decode_plain`, which leaves it in `decoded[plain_row]`) searched with a random
    focus of the same size (`random_focus`, seeded by the instance), so the policy's choice of
    layers is measured against none. It searches without the decoder's step tables and so
    builds them again: its time is not comparable, its cost and passes are."""
    def solve(inst):
        decode_plain(inst)
        start = decoded[plain_row]
        found = local_search(inst, start.placement, options, focus=random_focus(inst, fraction, seed))
        decoded[f"{plain_row}+random:{fraction:g}"] = Decoded(found.placement, found.cost_s, start.rollout,
                                                             start.costs_s, start.distinct, found)
        return found.placement
    return solve


def check(policy: NumpyPolicy, options: InstanceOptions, seeds: list[int], fractions: list[float],
          search: SearchOptions) -> dict:
    rows: dict[str, dict[str, list]] = {}
    for s in seeds:
        inst = random_instance(options, s)
        start = decode_rounds(inst, policy, Decoding(1))
        found = {"search": local_search(inst, start.placement, search)}
        for f in fractions:
            found[f"guided:{f:g}"] = decode_rounds(inst, policy, Decoding(1), search=search, focus=f).searched
            found[f"random:{f:g}"] = local_search(inst, start.placement, search, focus=random_focus(inst, f, s))
        for name, r in found.items():
            row = rows.setdefault(name, {"cost_s": [], "passes": [], "moves": []})
            row["cost_s"].append(r.cost_s)
            row["passes"].append(r.passes)
            row["moves"].append(r.moves)
    base = rows["search"]["cost_s"]
    for row in rows.values():
        gap = [100 * (c / b - 1) for c, b in zip(row["cost_s"], base)]
        mean, low, high = t_interval(gap)
        row["gap_to_search_pct"] = {"mean": mean, "ci95": [low, high]}
        row["wins"] = int(sum(g < -1e-7 for g in gap))
        row["losses"] = int(sum(g > 1e-7 for g in gap))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load-policy", required=True, help="a policy edge_placement --save-policy wrote (rounds)")
    ap.add_argument("--ppo", default="", help="the PpoOptions it was trained with (its network)")
    ap.add_argument("--train", default="", help="the InstanceOptions it was trained on")
    ap.add_argument("--instances", default="num_tasks=30,num_layers=8")
    ap.add_argument("--seeds", default="100:120")
    ap.add_argument("--fractions", default="0.03,0.05,0.1,0.2")
    ap.add_argument("--search", default="", help="SearchOptions as key=value,...")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    threadpool_limits(1)
    ppo, train = options_from(PpoOptions, args.ppo, "ppo"), options_from(InstanceOptions, args.train, "train")
    model, training = load_policy(args.load_policy, RoundPlacementEnv,
                                  {"scheme": "rounds", "ppo": vars(ppo), "train": vars(train)})
    seeds = seed_range(args.seeds)
    if set(seeds) & set(range(*training["train_seeds"])):
        raise SystemExit(f"--seeds {args.seeds} overlap the policy's training seeds {training['train_seeds']}")
    fractions = parse_fractions(args.fractions, "--fractions")
    search = options_from(SearchOptions, args.search, "search")
    rows = check(NumpyPolicy.from_policy(model.policy), options_from(InstanceOptions, args.instances, "instances"),
                 seeds, fractions, search)
    for name, row in rows.items():
        g = row["gap_to_search_pct"]
        print(f"{name:12s} gap to the plain search {g['mean']:+.3f}% [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] "
              f"wins/losses {row['wins']}/{row['losses']} passes {np.mean(row['passes']):.2f} "
              f"moves {np.mean(row['moves']):.2f}")
    if args.json:
        write_json(args.json, {"format": format_tag("placement-focus-check"), "experiment": "placement_focus_check",
                               "policy": training,
                               "instances": args.instances, "seeds": [seeds[0], seeds[-1] + 1],
                               "fractions": fractions, "search": vars(search), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
