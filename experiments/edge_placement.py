"""Edge-cloud layer placement: the RL policy against the exact ILP and the greedy heuristics
(issue 33, part 3; docs/rl-scheduling.md).

    python -m experiments.edge_placement --ppo total_timesteps=20000 \
        --json docs/results/rl/edge_placement.json

Trains the candidate-scoring PPO policy on random instances with the training seeds (`--train`
options), then on held-out seeds: small instances (`--small`) solved exactly by HiGHS, where
every method's gap to the optimum is reported; large instances (`--large`) where HiGHS gets a
time limit (its best placement and proven lower bound are reported) and the methods are
compared with greedy_regret. Solve times are wall-clock seconds per instance on one thread.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from caramel.sched.placement import HEURISTICS, InstanceOptions, random_instance, solve_ilp
from caramel.sched.placement.env import PlacementEnv, run_policy
from caramel.sched.rl import PpoOptions, num_policy_parameters, train_ppo
from experiments.rl_common import actor, options_from, seed_range, summary


def evaluate(options: InstanceOptions, seeds: list[int], act, time_limit_s: float, reference: str) -> dict:
    env = PlacementEnv(options, [0])
    costs: dict[str, list[float]] = {n: [] for n in list(HEURISTICS) + ["ppo", "ilp"]}
    times: dict[str, list[float]] = {n: [] for n in costs}
    bounds, optimal = [], 0
    for s in seeds:
        inst = random_instance(options, s)
        for name, h in list(HEURISTICS.items()) + [("ppo", lambda i: run_policy(env, i, act))]:
            start = time.perf_counter()
            p = h(inst)
            times[name].append(time.perf_counter() - start)
            assert inst.feasible(p), name
            costs[name].append(inst.cost_s(p))
        sol = solve_ilp(inst, time_limit_s)
        costs["ilp"].append(sol.cost_s)
        times["ilp"].append(sol.solve_s)
        bounds.append(sol.bound_s)
        optimal += int(sol.optimal)
    ref = costs[reference]
    return {
        "instances": vars(options), "seeds": [seeds[0], seeds[-1] + 1], "ilp_time_limit_s": time_limit_s,
        "ilp_proven_optimal": optimal, "reference": reference,
        "cost_s": {n: summary(v) for n, v in costs.items()},
        "gap_to_reference_pct": {n: summary([100 * (c / r - 1) for c, r in zip(v, ref)]) for n, v in costs.items()},
        "gap_to_lower_bound_pct": {n: summary([100 * (c / b - 1) for c, b in zip(v, bounds)])
                                   for n, v in costs.items()},
        "solve_s": {n: summary(v) for n, v in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="", help="InstanceOptions of the training instances")
    ap.add_argument("--small", default="", help="InstanceOptions of the small held-out instances (solved exactly)")
    ap.add_argument("--large", default="num_tasks=30,num_layers=8", help="InstanceOptions of the large ones")
    ap.add_argument("--ppo", default="", help="PpoOptions as key=value,...")
    ap.add_argument("--train-seeds", default="1000:3000")
    ap.add_argument("--test-seeds", default="0:40")
    ap.add_argument("--large-seeds", default="0:10")
    ap.add_argument("--large-time-limit-s", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    train_opts = options_from(InstanceOptions, args.train, "train")
    small = options_from(InstanceOptions, args.small, "small")
    large = options_from(InstanceOptions, args.large, "large")
    if not train_opts.num_edge == small.num_edge == large.num_edge:
        raise SystemExit("train, small and large must have the same num_edge (one policy row per node)")
    ppo = options_from(PpoOptions, args.ppo, "ppo")
    train = seed_range(args.train_seeds)
    test, large_seeds = seed_range(args.test_seeds), seed_range(args.large_seeds)
    if set(train) & (set(test) | set(large_seeds)):
        raise SystemExit("training and test seeds overlap; the test instances must be held out")
    start = time.perf_counter()
    model = train_ppo(PlacementEnv(train_opts, train), ppo)
    train_s = time.perf_counter() - start
    act = actor(model)
    report = {
        "experiment": "edge_placement", "train": vars(train_opts), "ppo": vars(ppo),
        "train_seeds": [train[0], train[-1] + 1], "train_s": train_s, "torch_threads": 1,
        "policy_parameters": num_policy_parameters(model),
        "small": evaluate(small, test, act, None, "ilp"),
        "large": evaluate(large, large_seeds, act, args.large_time_limit_s, "greedy_regret"),
    }
    for key in ("small", "large"):
        r = report[key]
        print(f"{key} (gap to {r['reference']}, %): " + ", ".join(
            f"{n} {v['mean']:+.2f}" for n, v in r["gap_to_reference_pct"].items())
            + f"; ilp optimal {r['ilp_proven_optimal']}/{r['seeds'][1] - r['seeds'][0]}; solve s: "
            + ", ".join(f"{n} {v['mean']:.4f}" for n, v in r["solve_s"].items()))
    print(f"trained {ppo.total_timesteps} steps in {train_s:.0f} s; {report['policy_parameters']} policy parameters")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
