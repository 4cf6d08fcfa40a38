"""Decoding a placement from the learned policy: greedy, or the best of N sampled placements.

Greedy decoding takes the highest-probability node at every step. Sampling decoding (as learned
routing and combinatorial solvers do: Bello et al. 2016, Kool et al. 2019) runs N rollouts of
the same instance side by side, draws each step's node from the policy's distribution, scores
every complete placement with the exact objective (`Instance.cost_s`) and keeps the cheapest.
Rollout 0 is the greedy one, so the result is never worse than greedy decoding (ties go to the
lowest rollout, so to greedy). All rollouts place the same number of layers, so they step in
lockstep (`batch.BatchPlacement`, the N episodes as arrays) and the network runs once per step
on the (N, K, F) batch, not N times. Draws come from a seeded torch generator: the same seed
gives the same placement.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.sched.placement.batch import BatchPlacement
from caramel.sched.placement.local_search import Searched
from caramel.sched.placement.problem import Instance


# The N rollouts step side by side: about 3.4 ms each on a 30-task, 8-layer instance (the stored
# sample:1024 run; docs/rl-scheduling.md), so the cap is a few minutes per instance; a count past
# it is taken for a typo, not run for hours. The largest count the results use is 1024.
MAX_SAMPLES = 65536


@dataclass(frozen=True)
class Decoding:
    """`greedy` (samples=1) or `sample:N` (N rollouts, the first greedy; N <= MAX_SAMPLES)."""

    samples: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise CaramelError(f"decoding samples must be an integer >= 1 (rollout 0 is the greedy one), "
                               f"got {self.samples!r}")
        if self.samples > MAX_SAMPLES:
            raise CaramelError(f"decoding samples must be at most {MAX_SAMPLES} (the rollouts run side by side), "
                               f"got {self.samples}")

    @property
    def name(self) -> str:
        return "greedy" if self.samples == 1 else f"sample:{self.samples}"


def parse_decoding(text: str) -> Decoding:
    """`greedy` or `sample:N` (1 <= N <= MAX_SAMPLES placements drawn, the best kept), N in ASCII
    digits as in the coflow decodings (`int()` would also take `+16`, `1_6`, ` 16` or other
    scripts' digits)."""
    kind, sep, count = text.strip().partition(":")
    if kind == "greedy" and not sep:
        return Decoding(1)
    if kind == "sample" and re.fullmatch(r"[0-9]+", count):
        digits = count.lstrip("0")
        # the length first: int() refuses a count past its digit limit (sys.get_int_max_str_digits)
        if len(digits) > len(str(MAX_SAMPLES)) or int(digits or "0") > MAX_SAMPLES:
            raise CaramelError(f"decode {text!r}: N is over the cap of {MAX_SAMPLES} samples (the rollouts run "
                               f"side by side: minutes per large instance there); expected "
                               f"'greedy' or 'sample:N' with 1 <= N <= {MAX_SAMPLES}")
        if int(digits or "0") >= 1:
            return Decoding(int(digits))
    raise CaramelError(f"decode {text!r}: expected 'greedy' or 'sample:N' with N an integer >= 1 in ASCII digits "
                       f"(e.g. sample:16; at most {MAX_SAMPLES})")


@dataclass(frozen=True)
class Decoded:
    placement: list[list[int]]
    cost_s: float
    rollout: int  # which rollout won (0: the greedy one)
    costs_s: list[float]  # every rollout's cost, rollout 0 first
    distinct: int  # how many different placements the rollouts made
    searched: Searched | None = None  # with a local search after decoding: its result


def step_probabilities(policy, observations: np.ndarray) -> torch.Tensor:
    """(N, K) probabilities of the rows of N observations, one forward pass (masked rows 0)."""
    with torch.no_grad():
        obs = torch.as_tensor(observations, dtype=torch.float32)
        return policy.get_distribution(obs).distribution.probs


def decode(inst: Instance, policy, decoding: Decoding, seed: int = 0) -> Decoded:
    """Place `inst` with the actor-critic `policy` (a `caramel.sched.rl.CandidatePolicy` trained
    on `PlacementEnv`, whose observations `BatchPlacement` reproduces) and `decoding`."""
    if not isinstance(decoding, Decoding):
        raise CaramelError(f"decoding must be a Decoding (parse_decoding('sample:16')), got {decoding!r}")
    gen = torch.Generator().manual_seed(int(seed))
    rollouts = BatchPlacement(inst, decoding.samples)
    while not rollouts.done:
        probs = step_probabilities(policy, rollouts.observe())
        actions = probs.argmax(dim=1)  # the row SB3's deterministic predict picks
        if decoding.samples > 1:
            actions[1:] = torch.multinomial(probs[1:], 1, generator=gen).squeeze(1)
        rollouts.step(actions.numpy())
    return best_of(inst, rollouts)


def best_of(inst: Instance, rollouts: BatchPlacement) -> Decoded:
    """The cheapest of finished `rollouts` (the first on a tie: greedy, rollout 0, wins)."""
    placements = rollouts.placements()
    costs = [inst.cost_s(p) for p in placements]
    best = int(np.argmin(costs))
    distinct = len({tuple(map(tuple, p)) for p in placements})
    return Decoded([list(p) for p in placements[best]], costs[best], best, costs, distinct)
