"""Decoding the coflow policy: greedy, or the best of N sampled schedules.

Greedy decoding serves, at every event, the candidate the policy scores highest: one forward
pass per event, online (it sees only what has been released). With a margin (`greedy:M`) it
leaves the base heuristic's pick (row 0) only where the best row's logit beats row 0's by more
than M: the policy deviates rarely and its mistakes cost, so a deviation it is unsure of is
left to the heuristic (M is chosen on validation traces). Sampling decoding (`sample:N`)
runs the trace N times, schedule 0 greedy and schedules 1..N-1 drawing each event's pick from
the policy's probabilities (softmax of its logits over a temperature T), and keeps the schedule
with the lowest objective (ties: the lowest index, so greedy). It is never worse than greedy,
since greedy is among the N, but it costs N simulations of the whole trace and needs the trace
in advance (future arrivals included), like the rollout: an offline planner, not an online
scheduler. Needs the `rl` extra (the environment and the policy).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.sched.coflow.env import CoflowEnv
from caramel.sched.coflow.fabric import Result
from caramel.sched.coflow.rollout import objective_total
from caramel.sched.coflow.workload import Workload

# observation (K, F) -> a logit per row (masked rows very negative)
Logits = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Decoding:
    """`greedy[:M]` (samples=1; leave row 0 only by a logit margin over M) or `sample:N[:T]`
    (the best of N schedules, the first greedy, the others drawn from softmax(logits / T))."""

    samples: int = 1
    temperature: float = 1.0
    margin: float = 0.0

    @property
    def name(self) -> str:
        if self.samples == 1:
            return "greedy" + ("" if self.margin == 0.0 else f":{self.margin:g}")
        return f"sample:{self.samples}" + ("" if self.temperature == 1.0 else f":{self.temperature:g}")

    def pick(self, logits: np.ndarray) -> int:
        """The greedy row: the best, unless it beats row 0 by no more than the margin."""
        best = int(np.argmax(logits))
        return best if logits[best] - logits[0] > self.margin else 0


def parse_decoding(text: str) -> Decoding:
    """`greedy`, `greedy:M` (M >= 0), `sample:N` or `sample:N:T` (N >= 2, T > 0)."""
    parts = text.split(":")
    try:
        value = float(parts[-1]) if len(parts) == (2 if parts[0] == "greedy" else 3) else None
        if value is not None and not np.isfinite(value):
            raise ValueError
        if parts[0] == "greedy" and len(parts) <= 2 and (value is None or value >= 0):
            return Decoding(margin=0.0 if value is None else value)
        if parts[0] == "sample" and len(parts) in (2, 3) and parts[1].isdigit() and int(parts[1]) >= 2 and (
                value is None or value > 0):
            return Decoding(int(parts[1]), temperature=1.0 if value is None else value)
    except ValueError:
        pass
    raise CaramelError(f"decoding {text!r}: expected greedy, greedy:M (M >= 0), sample:N or sample:N:T with "
                       f"N >= 2 and T > 0 (e.g. greedy:1, sample:8 or sample:8:2)")


def policy_logits(model) -> Logits:
    """The rows' logits under a trained PPO model's actor (float64)."""
    policy = model.policy

    def logits(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = policy.get_distribution(torch.as_tensor(obs[None], dtype=torch.float32)).distribution.logits
            return out[0].double().numpy()
    return logits


@dataclass
class Decoded:
    result: Result  # the kept schedule's
    totals: list[float]  # each schedule's objective total (summed CCT or weighted JCT), in order
    kept: int  # its index (0: greedy)


def decode(env: CoflowEnv, workload: Workload, logits: Logits, decoding: Decoding = Decoding(),
           seed: int = 0) -> Decoded:
    """Run `workload` in `env` `decoding.samples` times (the first greedy, with the decoding's
    margin) and keep the best."""
    rng = np.random.default_rng(seed)
    best: tuple[float, int, Result] | None = None
    totals = []
    for i in range(decoding.samples):
        obs, _ = env.reset(options={"workload": workload})
        done = env.episode_done
        while not done:
            z = logits(obs)
            if i == 0:
                a = decoding.pick(z)
            else:
                p = np.exp((z - z.max()) / decoding.temperature)
                a = int(rng.choice(len(p), p=p / p.sum()))
            obs, _, done, _, _ = env.step(a)
        result = env.result()
        totals.append(objective_total(result, env.options.objective))
        if best is None or totals[-1] < best[0]:
            best = (totals[-1], i, result)
    return Decoded(best[2], totals, best[1])
