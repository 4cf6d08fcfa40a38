"""Decoding the coflow policy: greedy, checked by rollouts, or the best of N sampled schedules.

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
scheduler. Checked decoding (`check:M`) uses the policy to propose and the rollout to decide:
at an event where the policy's best row other than row 0 scores within M below row 0 or above
it, both rows are rolled out (each goes first, then the base heuristic to the end) and the
cheaper is served; elsewhere the base's pick is. It is never worse than the base heuristic
(Bertsekas's rollout over a candidate set that holds the base's pick; tested), costs two
simulations per checked event instead of the full rollout's one per candidate at every event,
and, like the rollout, needs the trace in advance. Its online counterparts, `arrived:check`
and `arrived:base` (and the policy alone, `arrived:greedy`), decide on the jobs that have
arrived only (`coflow/online.py`). Greedy decoding reads one thing of the whole trace: its
feature scale (the mean isolated coflow time of all the trace's coflows, future jobs
included); `arrived:greedy` is the same policy with that scale taken over the arrived jobs.
Needs the `rl` extra (the environment and the policy).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.sched.coflow.env import CoflowEnv
from caramel.sched.coflow.fabric import Result
from caramel.sched.coflow.online import ARRIVED_MODES, ArrivedDecision, decode_arrived
from caramel.sched.coflow.rollout import MARGIN, objective_total, rollout_values
from caramel.sched.coflow.workload import Workload

# observation (K, F) -> a logit per row (masked rows very negative)
Logits = Callable[[np.ndarray], np.ndarray]

# `sample:N` simulates the whole trace N times, one after another: about 0.15 s each on a 10-job
# trace (sample:8:2 took 1.2 s per trace; docs/rl-scheduling.md), so the cap is about 10 minutes
# per trace; a count past it is taken for a typo, not run for hours. The results use N = 8.
MAX_SAMPLES = 4096


@dataclass(frozen=True)
class Decoding:
    """`greedy[:M]` (samples=1; leave row 0 only by a logit margin over M), `check:M` (the
    policy's proposal against row 0 by rollouts), `sample:N[:T]` (the best of N schedules, the
    first greedy, the others drawn from softmax(logits / T)) or `arrived:greedy|base|check`
    (every decision on the arrived jobs only; `coflow/online.py`)."""

    samples: int = 1
    temperature: float = 1.0
    margin: float = 0.0
    check: float | None = None  # `check:M`: roll out the policy's proposal against the base's pick
    arrived: str | None = None  # `arrived:greedy|base|check`: decide on the arrived jobs only

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) \
                or not 1 <= self.samples <= MAX_SAMPLES:
            raise CaramelError(f"decoding samples must be an integer from 1 to {MAX_SAMPLES} (each simulates the "
                               f"whole trace), got {self.samples!r}")

    @property
    def name(self) -> str:
        if self.arrived is not None:
            return f"arrived:{self.arrived}"
        if self.check is not None:
            return f"check:{self.check:g}"
        if self.samples == 1:
            return "greedy" + ("" if self.margin == 0.0 else f":{self.margin:g}")
        return f"sample:{self.samples}" + ("" if self.temperature == 1.0 else f":{self.temperature:g}")

    @property
    def online(self) -> bool:
        """Whether its decisions read no future arrival's work: check:M and sample:N roll out or
        replay the whole trace (offline planners). Greedy counts as online although its feature
        scale is the whole trace's (module docstring); arrived:* read only the arrived jobs."""
        return self.check is None and self.samples == 1

    def pick(self, logits: np.ndarray) -> int:
        """The greedy row: the best, unless it beats row 0 by no more than the margin."""
        best = int(np.argmax(logits))
        return best if logits[best] - logits[0] > self.margin else 0


_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # ASCII only: no spaces, _, signs


def parse_decoding(text: str) -> Decoding:
    """`greedy`, `greedy:M`, `check:M` (M >= 0), `sample:N` or `sample:N:T` (2 <= N <=
    MAX_SAMPLES, T > 0), `arrived:greedy`, `arrived:base` or `arrived:check`; numbers in ASCII
    digits only (no spaces, underscores or signs)."""
    parts = text.split(":")
    if len(parts) == 2 and parts[0] == "arrived" and parts[1] in ARRIVED_MODES:
        return Decoding(arrived=parts[1])
    if parts[0] == "sample" and len(parts) in (2, 3) and re.fullmatch(r"[0-9]+", parts[1]):
        digits = parts[1].lstrip("0")
        # the length first: int() refuses a count past its digit limit (sys.get_int_max_str_digits)
        if len(digits) > len(str(MAX_SAMPLES)) or int(digits or "0") > MAX_SAMPLES:
            raise CaramelError(f"decoding {text!r}: N is over the cap of {MAX_SAMPLES} samples (each simulates the "
                               f"whole trace: about 10 minutes per 10-job trace there); expected sample:N or "
                               f"sample:N:T with 2 <= N <= {MAX_SAMPLES}")
    numbers_ok = all(_NUMBER.fullmatch(p) for p in parts[1:])
    try:
        value = float(parts[-1]) if numbers_ok and len(parts) == (
            2 if parts[0] in ("greedy", "check") else 3) else None
        if value is not None and not np.isfinite(value):
            raise ValueError
        if numbers_ok and parts[0] == "greedy" and len(parts) <= 2:
            return Decoding(margin=0.0 if value is None else value)
        if numbers_ok and parts[0] == "check" and len(parts) == 2:
            return Decoding(check=value)
        # int() of the count without its leading zeros (its length is checked against the cap above),
        # as in the placement decodings: zero padding past int()'s digit limit still reads as N
        if numbers_ok and parts[0] == "sample" and len(parts) in (2, 3) and re.fullmatch(r"[0-9]+", parts[1]) \
                and int(parts[1].lstrip("0") or "0") >= 2 and (value is None or value > 0):
            return Decoding(int(parts[1].lstrip("0")), temperature=1.0 if value is None else value)
    except ValueError:
        pass
    raise CaramelError(f"decoding {text!r}: expected greedy, greedy:M, check:M (M >= 0), sample:N or sample:N:T "
                       f"with 2 <= N <= {MAX_SAMPLES} and T > 0, in ASCII digits (e.g. greedy:1, check:2, sample:8 or "
                       f"sample:8:2), arrived:greedy, arrived:base or arrived:check")


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
    checks: int = 0  # events `check:M` rolled out (two simulations each), `arrived:*` rolled out
    decisions: list[ArrivedDecision] | None = None  # `arrived:*`: every decision, in order


def decode(env: CoflowEnv, workload: Workload, logits: Logits, decoding: Decoding = Decoding(),
           seed: int = 0) -> Decoded:
    """Run `workload` in `env` `decoding.samples` times (the first greedy, with the decoding's
    margin) and keep the best; `arrived:*` once, deciding on the arrived jobs."""
    if decoding.arrived is not None:
        result, decisions = decode_arrived(env, workload, logits, decoding.arrived)
        total = objective_total(result, env.options.objective)
        return Decoded(result, [total], 0, sum(bool(d.values) for d in decisions), decisions)
    rng = np.random.default_rng(seed)
    best: tuple[float, int, Result] | None = None
    totals = []
    checks = 0
    for i in range(decoding.samples):
        obs, _ = env.reset(options={"workload": workload})
        done = env.episode_done
        while not done:
            z = logits(obs)
            if decoding.check is not None:
                a = _checked(env, z, decoding.check)
                checks += a is not None
                a = a or 0
            elif i == 0:
                a = decoding.pick(z)
            else:
                p = np.exp((z - z.max()) / decoding.temperature)
                a = int(rng.choice(len(p), p=p / p.sum()))
            obs, _, done, _, _ = env.step(a)
        result = env.result()
        totals.append(objective_total(result, env.options.objective))
        if best is None or totals[-1] < best[0]:
            best = (totals[-1], i, result)
    return Decoded(best[2], totals, best[1], checks)


def _checked(env: CoflowEnv, z: np.ndarray, within: float) -> int | None:
    """Row 0 or the policy's best other row, whichever the rollout finds cheaper; None (row 0,
    unchecked) where that row scores more than `within` below row 0 or there is none."""
    cands = env.candidates()
    if len(cands) < 2:
        return None
    j = 1 + int(np.argmax(z[1:len(cands)]))
    if z[j] - z[0] <= -within:
        return None
    values = rollout_values(env.sim, env.base_scheduler, [cands[0], cands[j]], env.options.objective)
    return j if values[1] < values[0] - MARGIN * abs(values[0]) else 0
