"""Coflow scheduling by RL against the classic heuristics, on held-out synthetic traces (issue 33,
part 2; docs/rl-scheduling.md).

    python -m experiments.coflow_rl --objective cct --ppo total_timesteps=20000 \
        --json docs/results/rl/coflow_cct.json

    python -m experiments.coflow_rl --objective weighted_jct --teacher rollout --train-trace num_jobs=6 \
        --ppo width=64 --improve rounds=3,episodes=60,epochs=30,learning_rate=1e-3 --test-seeds 0:20 \
        --rollout-baseline --json docs/results/rl/coflow_weighted_jct_improved.json

Trains the candidate-scoring policy on traces with the training seeds, by PPO alone (`--teacher
none`) or by imitating the rollout of the base heuristic (`--teacher rollout`,
caramel.sched.improve; then `--finetune-steps` of PPO if asked), then runs FIFO, SCF, SEBF,
weighted SEBF, weighted SRJF and the policy (deterministic: one forward pass per event) on traces
with the disjoint test seeds, and on larger traces (`--large`) the policy never saw; with
`--rollout-baseline`, the rollout itself too (a lookahead, reported apart from the policy).
Reports each scheduler's mean objective, its solve time per trace, and the policy against the
base and the best heuristic per trace.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from caramel.sched.coflow import HEURISTICS, TraceOptions, simulate, synthetic_trace
from caramel.sched.coflow.env import CoflowEnv, EnvOptions, run_policy
from caramel.sched.coflow.rollout import rollout_scheduler, rollout_teacher
from caramel.sched.improve import ImproveOptions, improve
from caramel.sched.rl import PpoOptions, make_ppo, num_policy_parameters, train_ppo
from experiments.rl_common import actor, options_from, seed_range, summary

METRIC = {"cct": "avg_cct_s", "weighted_jct": "avg_weighted_jct_s"}


def evaluate(env: CoflowEnv, trace: TraceOptions, seeds: list[int], act, metric: str, rollout: bool) -> dict:
    methods = {name: (lambda w, h=h: simulate(w, h)) for name, h in HEURISTICS.items()}
    methods["ppo"] = lambda w: run_policy(env, w, act)
    if rollout:
        scheduler = rollout_scheduler(env.base_scheduler, env.options.objective, env.options.max_candidates)
        methods["rollout"] = lambda w: simulate(w, scheduler)
    per: dict[str, list[float]] = {name: [] for name in methods}
    solve_s: dict[str, list[float]] = {name: [] for name in methods}
    for s in seeds:
        w = synthetic_trace(trace, s)
        for name, run in methods.items():
            start = time.perf_counter()
            per[name].append(getattr(run(w), metric))
            solve_s[name].append(time.perf_counter() - start)
    best = [min(per[n][i] for n in HEURISTICS) for i in range(len(seeds))]
    base = per[env.options.base]
    report = {"seeds": [seeds[0], seeds[-1] + 1], "trace": vars(trace),
              "schedulers": {n: summary(v) for n, v in per.items()},
              "solve_s": {n: summary(v) for n, v in solve_s.items()}}
    for name in ("ppo", "rollout") if rollout else ("ppo",):  # "ppo": the learned policy, however trained
        report[f"{name}_vs_best_heuristic_pct"] = summary([100 * (p / b - 1) for p, b in zip(per[name], best)])
        report[f"{name}_vs_base_pct"] = summary([100 * (p / b - 1) for p, b in zip(per[name], base)])
        report[f"{name}_wins_vs_base"] = int(sum(p < b * (1 - 1e-9) for p, b in zip(per[name], base)))
        report[f"{name}_losses_vs_base"] = int(sum(p > b * (1 + 1e-9) for p, b in zip(per[name], base)))
        report[f"{name}_wins_vs_best_heuristic"] = int(sum(p < b * (1 - 1e-9) for p, b in zip(per[name], best)))
        report[f"{name}_losses_vs_best_heuristic"] = int(sum(p > b * (1 + 1e-9) for p, b in zip(per[name], best)))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objective", default="cct", choices=sorted(METRIC))
    ap.add_argument("--trace", default="", help="TraceOptions as key=value,... (training and test traces)")
    ap.add_argument("--train-trace", default=None, help="TraceOptions of the training traces (default: --trace)")
    ap.add_argument("--large", default="num_jobs=30", help="TraceOptions of the larger held-out traces")
    ap.add_argument("--env", default="", help="EnvOptions as key=value,... (default base: the best heuristic "
                                              "of the objective, sebf for cct, weighted_srjf for weighted_jct)")
    ap.add_argument("--ppo", default="", help="PpoOptions as key=value,...")
    ap.add_argument("--teacher", default="none", choices=("none", "rollout"),
                    help="none: PPO alone; rollout: imitate the base heuristic's rollout (then --finetune-steps of PPO)")
    ap.add_argument("--improve", default="", help="ImproveOptions as key=value,... (with --teacher rollout)")
    ap.add_argument("--finetune-steps", type=int, default=0, help="PPO steps after imitation (with --teacher)")
    ap.add_argument("--rollout-baseline", action="store_true", help="also run the rollout itself (slow lookahead)")
    ap.add_argument("--train-seeds", default="1000:1256")
    ap.add_argument("--test-seeds", default="0:40")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    trace = options_from(TraceOptions, args.trace, "trace")
    large = options_from(TraceOptions, args.large, "large")
    train_trace = trace if args.train_trace is None else options_from(TraceOptions, args.train_trace, "train-trace")
    env_text = args.env or f"objective={args.objective},base={'sebf' if args.objective == 'cct' else 'weighted_srjf'}"
    env_opts = options_from(EnvOptions, env_text, "env")
    if env_opts.objective != args.objective:
        raise SystemExit(f"--env objective={env_opts.objective} differs from --objective {args.objective}")
    ppo = options_from(PpoOptions, args.ppo, "ppo")
    train, test = seed_range(args.train_seeds), seed_range(args.test_seeds)
    if set(train) & set(test):
        raise SystemExit("training and test seeds overlap; the test traces must be held out")
    if args.teacher == "none" and (args.improve or args.finetune_steps):
        raise SystemExit("--improve, --finetune-steps shape the imitation of a teacher; pass --teacher too")
    if args.finetune_steps < 0:
        raise SystemExit(f"--finetune-steps must be >= 0, got {args.finetune_steps}")
    improve_opts = options_from(ImproveOptions, args.improve, "improve")
    start = time.perf_counter()
    train_env = CoflowEnv(train_trace, train, env_opts)
    rounds = []
    if args.teacher == "none":
        model = train_ppo(train_env, ppo)
    else:
        model = make_ppo(train_env, ppo)
        rounds = improve(model, train_env, rollout_teacher, improve_opts)
        if args.finetune_steps > 0:
            model.learn(total_timesteps=args.finetune_steps)
    train_s = time.perf_counter() - start
    metric = METRIC[args.objective]
    act = actor(model)
    env = CoflowEnv(trace, [0], env_opts)
    report = {
        "experiment": "coflow_rl", "objective": args.objective, "metric": metric, "env": vars(env_opts),
        "train_trace": vars(train_trace), "ppo": vars(ppo), "teacher": args.teacher,
        "improve": vars(improve_opts) if args.teacher != "none" else None,
        "improve_rounds": rounds, "finetune_steps": args.finetune_steps if args.teacher != "none" else None,
        "train_seeds": [train[0], train[-1] + 1], "train_s": train_s,
        "policy_parameters": num_policy_parameters(model), "torch_threads": 1,
        "held_out": evaluate(env, trace, test, act, metric, args.rollout_baseline),
        "held_out_large": evaluate(env, large, test, act, metric, False),
    }
    for key in ("held_out", "held_out_large"):
        r = report[key]
        print(f"{key}: " + ", ".join(f"{n} {v['mean']:.5f}" for n, v in r["schedulers"].items())
              + f"; ppo vs best heuristic {r['ppo_vs_best_heuristic_pct']['mean']:+.2f}%"
              + f", vs base {r['ppo_vs_base_pct']['mean']:+.2f}% ({r['ppo_wins_vs_base']} wins,"
              + f" {r['ppo_losses_vs_base']} losses)")
    print(f"trained ({args.teacher}) in {train_s:.0f} s; {report['policy_parameters']} policy parameters")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
