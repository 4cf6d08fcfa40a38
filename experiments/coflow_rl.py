"""Coflow scheduling by RL against the classic heuristics, on held-out synthetic traces (issue 33,
part 2; docs/rl-scheduling.md).

    python -m experiments.coflow_rl --objective cct --ppo total_timesteps=20000 \
        --json docs/results/rl/coflow_cct.json

Trains the candidate-scoring PPO policy on traces with the training seeds, then runs FIFO, SCF,
SEBF, weighted SEBF, weighted SRJF and the policy (deterministic) on traces with the disjoint test seeds, and
on larger traces (`--large`) the policy never saw. Reports each scheduler's mean average coflow
completion time and mean average weighted job completion time, and the policy against the best
heuristic per trace.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from caramel.sched.coflow import HEURISTICS, TraceOptions, simulate, synthetic_trace
from caramel.sched.coflow.env import CoflowEnv, EnvOptions, run_policy
from caramel.sched.rl import PpoOptions, num_policy_parameters, train_ppo
from experiments.rl_common import actor, options_from, seed_range, summary

METRIC = {"cct": "avg_cct_s", "weighted_jct": "avg_weighted_jct_s"}


def evaluate(env: CoflowEnv, trace: TraceOptions, seeds: list[int], act, metric: str) -> dict:
    per = {name: [] for name in list(HEURISTICS) + ["ppo"]}
    for s in seeds:
        w = synthetic_trace(trace, s)
        for name, h in HEURISTICS.items():
            per[name].append(getattr(simulate(w, h), metric))
        per["ppo"].append(getattr(run_policy(env, w, act), metric))
    best = [min(per[n][i] for n in HEURISTICS) for i in range(len(seeds))]
    base = per[env.options.base]
    return {
        "seeds": [seeds[0], seeds[-1] + 1], "trace": vars(trace),
        "schedulers": {n: summary(v) for n, v in per.items()},
        "ppo_vs_best_heuristic_pct": summary([100 * (p / b - 1) for p, b in zip(per["ppo"], best)]),
        "ppo_vs_base_pct": summary([100 * (p / b - 1) for p, b in zip(per["ppo"], base)]),
        "ppo_wins_vs_base": int(sum(p < b * (1 - 1e-9) for p, b in zip(per["ppo"], base))),
        "ppo_losses_vs_base": int(sum(p > b * (1 + 1e-9) for p, b in zip(per["ppo"], base))),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objective", default="cct", choices=sorted(METRIC))
    ap.add_argument("--trace", default="", help="TraceOptions as key=value,... (training and test traces)")
    ap.add_argument("--large", default="num_jobs=30", help="TraceOptions of the larger held-out traces")
    ap.add_argument("--env", default="", help="EnvOptions as key=value,... (default base: the best heuristic "
                                              "of the objective, sebf for cct, weighted_srjf for weighted_jct)")
    ap.add_argument("--ppo", default="", help="PpoOptions as key=value,...")
    ap.add_argument("--train-seeds", default="1000:1256")
    ap.add_argument("--test-seeds", default="0:40")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    trace = options_from(TraceOptions, args.trace, "trace")
    large = options_from(TraceOptions, args.large, "large")
    env_text = args.env or f"objective={args.objective},base={'sebf' if args.objective == 'cct' else 'weighted_srjf'}"
    env_opts = options_from(EnvOptions, env_text, "env")
    if env_opts.objective != args.objective:
        raise SystemExit(f"--env objective={env_opts.objective} differs from --objective {args.objective}")
    ppo = options_from(PpoOptions, args.ppo, "ppo")
    train, test = seed_range(args.train_seeds), seed_range(args.test_seeds)
    if set(train) & set(test):
        raise SystemExit("training and test seeds overlap; the test traces must be held out")
    start = time.perf_counter()
    model = train_ppo(CoflowEnv(trace, train, env_opts), ppo)
    train_s = time.perf_counter() - start
    metric = METRIC[args.objective]
    act = actor(model)
    env = CoflowEnv(trace, [0], env_opts)
    report = {
        "experiment": "coflow_rl", "objective": args.objective, "metric": metric, "env": vars(env_opts),
        "ppo": vars(ppo), "train_seeds": [train[0], train[-1] + 1], "train_s": train_s,
        "policy_parameters": num_policy_parameters(model), "torch_threads": 1,
        "held_out": evaluate(env, trace, test, act, metric),
        "held_out_large": evaluate(env, large, test, act, metric),
    }
    for key in ("held_out", "held_out_large"):
        r = report[key]
        print(f"{key}: " + ", ".join(f"{n} {v['mean']:.5f}" for n, v in r["schedulers"].items())
              + f"; ppo vs best heuristic {r['ppo_vs_best_heuristic_pct']['mean']:+.2f}%"
              + f", vs base {r['ppo_vs_base_pct']['mean']:+.2f}% ({r['ppo_wins_vs_base']} wins,"
              + f" {r['ppo_losses_vs_base']} losses)")
    print(f"trained {ppo.total_timesteps} steps in {train_s:.0f} s; {report['policy_parameters']} policy parameters")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
