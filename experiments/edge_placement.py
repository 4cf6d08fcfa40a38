"""Edge-cloud layer placement: the RL policy against the exact ILP and the greedy heuristics
(issue 33, part 3; docs/rl-scheduling.md).

    python -m experiments.edge_placement --ppo total_timesteps=20000 \
        --json docs/results/rl/edge_placement.json
    python -m experiments.edge_placement --teacher ilp --ppo width=64 \
        --improve rounds=3,episodes=100,epochs=40,learning_rate=1e-3 --test-seeds 0:20 --large-seeds 0:5 \
        --large-time-limit-s 5 --json docs/results/rl/edge_placement_improved.json

Trains the candidate-scoring policy on random instances with the training seeds (`--train`
options, and `--train-mid` ones too if given), by PPO alone (`--teacher none`) or by imitating a
teacher (caramel.sched.improve: `rollout` of greedy_regret, or `ilp`, the exact best completion;
then `--finetune-steps` of PPO if asked), then on held-out seeds: small instances (`--small`) solved exactly by HiGHS, where
every method's gap to the optimum is reported; large instances (`--large`) where HiGHS gets a
time limit (its best placement and proven lower bound are reported) and the methods are
compared with greedy_regret. The rollout of greedy_regret is reported too, as a lookahead
baseline apart from the policy. Solve times are wall-clock seconds per instance on one thread.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from caramel.sched.placement import HEURISTICS, InstanceOptions, random_instance, solve_ilp
from caramel.sched.improve import ImproveOptions, improve
from caramel.sched.placement.env import PlacementEnv, run_policy
from caramel.sched.placement.rollout import ilp_teacher, rollout_placement, rollout_teacher
from caramel.sched.rl import PpoOptions, make_ppo, num_policy_parameters, train_ppo
from experiments.rl_common import actor, options_from, seed_range, summary

TEACHERS = {"rollout": rollout_teacher, "ilp": ilp_teacher}


def evaluate(options: InstanceOptions, seeds: list[int], act, time_limit_s: float, reference: str,
             rollout: bool) -> dict:
    env = PlacementEnv(options, [0])
    extra = ["ppo", "rollout", "ilp"] if rollout else ["ppo", "ilp"]
    costs: dict[str, list[float]] = {n: [] for n in list(HEURISTICS) + extra}
    times: dict[str, list[float]] = {n: [] for n in costs}
    bounds, optimal = [], 0
    for s in seeds:
        inst = random_instance(options, s)
        methods = list(HEURISTICS.items()) + [("ppo", lambda i: run_policy(env, i, act))]
        for name, h in methods + ([("rollout", rollout_placement)] if rollout else []):
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
    best = [min(costs[n][i] for n in HEURISTICS) for i in range(len(seeds))]
    return {
        "instances": vars(options), "seeds": [seeds[0], seeds[-1] + 1], "ilp_time_limit_s": time_limit_s,
        "ilp_proven_optimal": optimal, "reference": reference,
        "cost_s": {n: summary(v) for n, v in costs.items()},
        "gap_to_reference_pct": {n: summary([100 * (c / r - 1) for c, r in zip(v, ref)]) for n, v in costs.items()},
        "gap_to_lower_bound_pct": {n: summary([100 * (c / b - 1) for c, b in zip(v, bounds)])
                                   for n, v in costs.items()},
        "solve_s": {n: summary(v) for n, v in times.items()},
        # "ppo" is the learned policy, however trained; wins and losses per instance
        "vs_best_heuristic": {n: {"wins": int(sum(c < b * (1 - 1e-9) for c, b in zip(costs[n], best))),
                                  "losses": int(sum(c > b * (1 + 1e-9) for c, b in zip(costs[n], best)))}
                              for n in extra},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="", help="InstanceOptions of the training instances")
    ap.add_argument("--small", default="", help="InstanceOptions of the small held-out instances (solved exactly)")
    ap.add_argument("--large", default="num_tasks=30,num_layers=8", help="InstanceOptions of the large ones")
    ap.add_argument("--ppo", default="", help="PpoOptions as key=value,...")
    ap.add_argument("--train-mid", default="", help="InstanceOptions of a second training size (with --teacher)")
    ap.add_argument("--teacher", default="none", choices=sorted(TEACHERS) + ["none"],
                    help="none: PPO alone; rollout or ilp: imitate that teacher (then --finetune-steps of PPO)")
    ap.add_argument("--improve", default="", help="ImproveOptions as key=value,... (with --teacher)")
    ap.add_argument("--large-rollout", action="store_true", help="run the (slow) rollout baseline on the large ones too")
    ap.add_argument("--finetune-steps", type=int, default=0, help="PPO steps after imitation (with --teacher)")
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
    if args.teacher == "none" and (args.improve or args.finetune_steps or args.train_mid):
        raise SystemExit("--improve, --finetune-steps and --train-mid shape the imitation of a teacher; pass --teacher too")
    if args.finetune_steps < 0:
        raise SystemExit(f"--finetune-steps must be >= 0, got {args.finetune_steps}")
    improve_opts = options_from(ImproveOptions, args.improve, "improve")
    mid = options_from(InstanceOptions, args.train_mid, "train-mid") if args.train_mid else None
    if mid is not None and mid.num_edge != train_opts.num_edge:
        raise SystemExit("--train-mid must have the same num_edge as --train")
    start = time.perf_counter()
    envs = [PlacementEnv(train_opts, train)] + ([PlacementEnv(mid, train)] if mid is not None else [])
    rounds = []
    if args.teacher == "none":
        model = train_ppo(envs[0], ppo)
    else:
        model = make_ppo(envs[0], ppo)
        rounds = improve(model, envs, TEACHERS[args.teacher], improve_opts)
        if args.finetune_steps > 0:
            model.learn(total_timesteps=args.finetune_steps)
    train_s = time.perf_counter() - start
    act = actor(model)
    report = {
        "experiment": "edge_placement", "train": vars(train_opts), "ppo": vars(ppo),
        "train_mid": vars(mid) if mid is not None else None, "teacher": args.teacher,
        "improve": vars(improve_opts) if args.teacher != "none" else None, "improve_rounds": rounds,
        "finetune_steps": args.finetune_steps if args.teacher != "none" else None,
        "train_seeds": [train[0], train[-1] + 1], "train_s": train_s, "torch_threads": 1,
        "policy_parameters": num_policy_parameters(model),
        "small": evaluate(small, test, act, None, "ilp", True),
        "large": evaluate(large, large_seeds, act, args.large_time_limit_s, "greedy_regret",
                          args.large_rollout),
    }
    for key in ("small", "large"):
        r = report[key]
        print(f"{key} (gap to {r['reference']}, %): " + ", ".join(
            f"{n} {v['mean']:+.2f}" for n, v in r["gap_to_reference_pct"].items())
            + f"; ilp optimal {r['ilp_proven_optimal']}/{r['seeds'][1] - r['seeds'][0]}; solve s: "
            + ", ".join(f"{n} {v['mean']:.4f}" for n, v in r["solve_s"].items()))
    print(f"trained ({args.teacher}) in {train_s:.0f} s; {report['policy_parameters']} policy parameters")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
