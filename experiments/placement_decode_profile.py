"""Where a placement decoder's time goes, per decision (docs/rl-scheduling.md, decoding).

    python -m experiments.placement_decode_profile --json docs/results/rl/placement_decode_profile.json

Decodes large instances with an untrained policy of the experiment's architecture (the time per
step does not depend on the weights) and times each part of every step: building the
observation (`BatchPlacement.observe`), the network's forward pass to probabilities (torch,
through stable-baselines3, as `decode.decode` does; or numpy, as `fast_decode.decode_fast`),
picking the rows (argmax, seeded draws) and placing the layers (`BatchPlacement.step`, which
also picks each rollout's next task). The setup (the instance's tables) is timed apart, and the
heuristics on the same instances for scale. One thread, wall-clock; the mean per instance.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from caramel.jsonio import format_tag, write_json
from caramel.sched.placement import HEURISTICS, InstanceOptions, random_instance
from caramel.sched.placement.batch import BatchPlacement
from caramel.sched.placement.decode import step_probabilities
from caramel.sched.placement.env import PlacementEnv
from caramel.sched.placement.fast_decode import NumpyPolicy
from caramel.sched.rl import PpoOptions, make_ppo
from experiments.rl_common import options_from, seed_range


def profile_one(inst, forward, samples: int, seed: int) -> dict[str, float]:
    """Seconds per part for one decoding of `inst` (the loop of `decode`, timed part by part)."""
    clock = time.perf_counter
    parts = dict.fromkeys(["setup", "observe", "forward", "choose", "step"], 0.0)
    gen = torch.Generator().manual_seed(seed)
    start = clock()
    rollouts = BatchPlacement(inst, samples)
    parts["setup"] = clock() - start
    while not rollouts.done:
        a = clock()
        obs = rollouts.observe()
        b = clock()
        probs = forward(obs)
        c = clock()
        actions = np.argmax(probs, axis=1)
        if samples > 1:
            actions[1:] = torch.multinomial(torch.from_numpy(probs[1:]), 1, generator=gen).squeeze(1).numpy()
        d = clock()
        rollouts.step(actions)
        e = clock()
        parts["observe"] += b - a
        parts["forward"] += c - b
        parts["choose"] += d - c
        parts["step"] += e - d
    parts["total"] = clock() - start
    return parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", default="num_tasks=30,num_layers=8", help="InstanceOptions of the instances")
    ap.add_argument("--seeds", default="0:5")
    ap.add_argument("--samples", default="1,16,128", help="rollouts per decoding, comma-separated")
    ap.add_argument("--ppo", default="width=64,prior=0.5", help="the network (PpoOptions: width, prior, seed)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    threadpool_limits(1)  # numpy's BLAS too: one thread, as torch and the heuristics
    opts = options_from(InstanceOptions, args.large, "large")
    seeds = seed_range(args.seeds)
    samples = [int(n) for n in args.samples.split(",")]
    model = make_ppo(PlacementEnv(opts, [0]), options_from(PpoOptions, args.ppo, "ppo"))
    model.policy.set_training_mode(False)
    fast = NumpyPolicy.from_policy(model.policy)
    forwards = {"torch": lambda obs: step_probabilities(model.policy, obs).numpy(), "numpy": fast.probabilities}
    steps = opts.num_tasks * opts.num_layers
    report = {"experiment": "placement_decode_profile", "instances": vars(opts), "seeds": [seeds[0], seeds[-1] + 1],
              "ppo": args.ppo, "steps_per_instance": steps, "torch_threads": 1, "decoders": {}, "heuristics_s": {}}
    insts = [random_instance(opts, s) for s in seeds]
    profile_one(insts[0], forwards["numpy"], 2, 0)  # warm up both paths once
    profile_one(insts[0], forwards["torch"], 2, 0)
    for n in samples:
        for name, forward in forwards.items():
            runs = [profile_one(inst, forward, n, s) for inst, s in zip(insts, seeds)]
            mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            report["decoders"][f"{name}, {n} rollouts"] = {
                "instance_s": mean["total"], "setup_s": mean["setup"],
                "per_step_us": {k: 1e6 * mean[k] / steps for k in ("observe", "forward", "choose", "step")}}
            per = report["decoders"][f"{name}, {n} rollouts"]["per_step_us"]
            print(f"{name:5s} N={n:4d}: {mean['total'] * 1e3:7.1f} ms per instance (setup {mean['setup'] * 1e3:.1f} ms); "
                  "per step, us: " + ", ".join(f"{k} {v:.0f}" for k, v in per.items()))
    for name, h in HEURISTICS.items():
        times = []
        for inst in insts:
            start = time.perf_counter()
            h(inst)
            times.append(time.perf_counter() - start)
        report["heuristics_s"][name] = float(np.mean(times))
        print(f"{name}: {np.mean(times) * 1e3:.1f} ms per instance")
    if args.json:
        write_json(args.json, {"format": format_tag("placement-decode-profile"), **report})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
