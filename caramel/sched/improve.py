"""Policy improvement by rollouts, learned: train the candidate-scoring policy to imitate a
better teacher (approximate policy iteration, with DAgger's data collection).

The teacher is a lookahead that is too slow to deploy: for each candidate it runs the choice
and then a base heuristic to the end in the simulator, and keeps the best (a rollout of the
heuristic; Bertsekas's rollout improves on its base), or asks an exact solver for the best
completion. The network learns to pick what the teacher picks from the observation alone, so
at test time it is one forward pass per decision, no simulation. Round 0 collects the states
the teacher itself visits; later rounds run the learner and label the states it reaches (DAgger:
the learner is trained where its own mistakes lead it). Each round refits the actor (the encoder
and the scoring head of `caramel.sched.rl`) on all the states so far, minimizing the expected
regret of its choice (the teacher's cost of each row over the best row's, relative): a wrong
pick that costs much weighs much, near-ties nothing, which plain cross-entropy on the best row
would not tell apart.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from caramel.errors import CaramelError

# the environment (mid-episode) -> per candidate row, the cost of picking it (then the teacher's
# base to the end); inf for rows that are not candidates
Teacher = Callable[[gym.Env], np.ndarray]
MARGIN = 1e-6  # a row must beat row 0 (the base's pick) by this much, relative, to be the label


@dataclass(frozen=True)
class ImproveOptions:
    """`rounds=3,episodes=40` on the command line."""

    rounds: int = 3  # round 0 follows the teacher; rounds 1.. follow the learner
    episodes: int = 40  # episodes labelled per round
    epochs: int = 30  # passes over all labels so far, per round
    cross_entropy: float = 0.1  # weight of cross-entropy on the best row, beside the expected regret
    learning_rate: float = 3e-3
    batch_size: int = 256
    seed: int = 0  # episode draws and minibatch order

    def __post_init__(self) -> None:
        for name, low in (("rounds", 1), ("episodes", 1), ("epochs", 1), ("batch_size", 2)):
            if getattr(self, name) < low:
                raise CaramelError(f"improve option {name} must be >= {low}, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise CaramelError(f"improve option learning_rate must be > 0, got {self.learning_rate}")
        if not self.cross_entropy >= 0:
            raise CaramelError(f"improve option cross_entropy must be >= 0, got {self.cross_entropy}")


def actor_parameters(model) -> list[torch.nn.Parameter]:
    policy = model.policy
    return list(policy.features_extractor.parameters()) + list(policy.action_net.parameters())


def best_row(values: np.ndarray) -> int:
    """Row 0 unless another row is better by MARGIN (relative); then the first best row."""
    best = float(values.min())
    if values[0] <= best + MARGIN * abs(best):
        return 0
    return int(np.argmax(values <= best + MARGIN * abs(best)))


def relative_regret(values: np.ndarray) -> np.ndarray:
    """Per row: its cost over the best row's, minus 1 (0 for the best, 0 for non-candidates)."""
    best = float(values.min())
    regret = (values - best) / max(abs(best), 1e-12)
    return np.where(np.isfinite(regret), regret, 0.0)


def collect(env: gym.Env, teacher: Teacher, act: Callable[[np.ndarray], int] | None, seeds: list[int]
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Observations and the teacher's row costs along episodes run by `act` (None: by the teacher)."""
    observations, values = [], []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        done = bool(getattr(env, "episode_done", False))  # a trace that never needs a choice
        while not done:
            v = np.asarray(teacher(env), dtype=float)
            observations.append(obs)
            values.append(np.pad(v, (0, len(obs) - len(v)), constant_values=np.inf))
            obs, _, done, _, _ = env.step(best_row(v) if act is None else act(obs))
    return observations, values


def fit_actor(model, observations: list[np.ndarray], values: list[np.ndarray], options: ImproveOptions) -> dict:
    """Fit the actor to the teacher's costs (expected relative regret plus cross-entropy on the
    best row); its accuracy and the regret of its deterministic picks, in percent."""
    obs = torch.as_tensor(np.stack(observations), dtype=torch.float32)
    y = torch.as_tensor([best_row(v) for v in values], dtype=torch.long)
    regret = torch.as_tensor(np.stack([relative_regret(v) for v in values]) * 100.0, dtype=torch.float32)
    params = actor_parameters(model)
    opt = torch.optim.Adam(params, lr=options.learning_rate)
    gen = torch.Generator().manual_seed(options.seed)
    policy = model.policy
    policy.set_training_mode(True)
    for _ in range(options.epochs):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), options.batch_size):
            idx = perm[i:i + options.batch_size]
            dist = policy.get_distribution(obs[idx])
            expected = (dist.distribution.probs * regret[idx]).sum(dim=1).mean()
            loss = expected - options.cross_entropy * dist.log_prob(y[idx]).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        dist = policy.get_distribution(obs)
        picks = dist.distribution.probs.argmax(dim=1)
        accuracy = float((picks == y).float().mean())
        pick_regret = float(regret.gather(1, picks[:, None]).mean())
        base_regret = float(regret[:, 0].mean())
    return {"states": len(y), "accuracy": accuracy, "teacher_deviates": float((y != 0).float().mean()),
            "regret_pct_policy": pick_regret, "regret_pct_base": base_regret}


def improve(model, envs: gym.Env | list[gym.Env], teacher: Teacher, options: ImproveOptions) -> list[dict]:
    """DAgger rounds of `collect` (`options.episodes` in each of `envs`, e.g. instances of several
    sizes) and `fit_actor` on `model`'s actor; per-round statistics."""
    envs = envs if isinstance(envs, list) else [envs]
    observations: list[np.ndarray] = []
    values: list[np.ndarray] = []
    rounds = []

    def act(o: np.ndarray) -> int:
        return int(model.predict(o, deterministic=True)[0])

    for r in range(options.rounds):
        start = time.perf_counter()
        seeds = [options.seed * 1_000_003 + r * options.episodes + i for i in range(options.episodes)]
        for env in envs:
            obs, val = collect(env, teacher, None if r == 0 else act, seeds)
            observations += obs
            values += val
        label_s = time.perf_counter() - start
        stats = fit_actor(model, observations, values, options)
        rounds.append({"round": r, "label_s": label_s, "fit_s": time.perf_counter() - start - label_s, **stats})
    return rounds
