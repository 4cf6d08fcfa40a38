"""A candidate-scoring policy for stable-baselines3's PPO, shared by both schedulers.

The observation is a (K, F) table: one row per candidate (a coflow to serve first, a node to
place a layer on), column 0 says whether the row is a real candidate. Each row is embedded by
the same small MLP, the rows attend to each other (self-attention, as in Wang and Shen's
coflow scorer), and one shared linear layer scores each row: the action is the row picked.
The network's size depends on F and the width only, never on K, the number of jobs or nodes.
A learnable prior adds `prior * (1 - row/K)` to the scores; candidates come sorted by a
heuristic, so at start the policy leans towards it and learns where to deviate.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

MASKED_LOGIT = -1e8


class CandidateEncoder(BaseFeaturesExtractor):
    """(K, F) table -> [row embeddings (K*d), validity (K), mean embedding (d)]."""

    def __init__(self, observation_space: gym.spaces.Box, width: int = 32, heads: int = 2):
        k, f = observation_space.shape
        super().__init__(observation_space, features_dim=k * width + k + width)
        self.k, self.width = k, width
        self.embed = nn.Sequential(nn.Linear(f, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.attend = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mix = nn.Sequential(nn.Linear(2 * width, width), nn.Tanh())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        valid = obs[..., 0] > 0.5
        pad = ~valid
        pad[pad.all(dim=1)] = False  # a row of no candidates (only ever a dummy observation): attend anyway
        h = self.embed(obs)
        ctx, _ = self.attend(h, h, h, key_padding_mask=pad, need_weights=False)
        h = self.mix(torch.cat([h, ctx], dim=-1))
        weights = valid.float().unsqueeze(-1)
        pooled = (h * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return torch.cat([h.flatten(1), valid.float(), pooled], dim=1)


class CandidateHead(nn.Module):
    """Row embeddings -> one score per row (shared weights), invalid rows masked out."""

    def __init__(self, k: int, width: int, prior: float):
        super().__init__()
        self.k, self.width = k, width
        self.score = nn.Linear(width, 1)
        self.prior = nn.Parameter(torch.tensor(float(prior)))
        self.register_buffer("lean", 1.0 - torch.arange(k, dtype=torch.float32) / k)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        rows = latent[:, :self.k * self.width].view(-1, self.k, self.width)
        valid = latent[:, self.k * self.width:self.k * self.width + self.k]
        logits = self.score(rows).squeeze(-1) + self.prior * self.lean
        return torch.where(valid > 0.5, logits, torch.full_like(logits, MASKED_LOGIT))


class CandidatePolicy(ActorCriticPolicy):
    """PPO's actor-critic with `CandidateHead` as its action net (scores per candidate)."""

    def __init__(self, *args, prior: float = 2.0, **kwargs):
        self._prior = prior
        super().__init__(*args, **kwargs)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        enc = self.features_extractor
        self.action_net = CandidateHead(enc.k, enc.width, self._prior)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


@dataclass(frozen=True)
class PpoOptions:
    """PPO's knobs as the experiments set them (`total_timesteps=20000,seed=1`)."""

    total_timesteps: int = 20_000
    seed: int = 0
    learning_rate: float = 3e-4
    n_steps: int = 512  # rollout length per update
    batch_size: int = 128
    n_epochs: int = 5
    gamma: float = 1.0  # undiscounted: the return is the whole episode's cost
    ent_coef: float = 0.01
    width: int = 32
    prior: float = 2.0

    def __post_init__(self) -> None:
        if self.total_timesteps < 1 or self.n_steps < 2 or self.batch_size < 2 or self.n_epochs < 1:
            raise ValueError("total_timesteps, n_epochs must be >= 1 and n_steps, batch_size >= 2")
        if not 0 < self.gamma <= 1 or self.learning_rate <= 0 or self.width < 2:
            raise ValueError("gamma must be in (0, 1], learning_rate > 0, width >= 2")


def make_ppo(env: gym.Env, options: PpoOptions) -> PPO:
    """An untrained PPO agent with the candidate-scoring policy (CPU, one thread's worth).

    It logs nowhere: left to itself, `learn` makes a logger that creates an empty
    `SB3-<time>` folder in the system temp dir on every call, and verbose=0 writes nothing to it.
    """
    model = PPO(CandidatePolicy, env, learning_rate=options.learning_rate, n_steps=options.n_steps,
                batch_size=options.batch_size, n_epochs=options.n_epochs, gamma=options.gamma,
                ent_coef=options.ent_coef, seed=options.seed, device="cpu", verbose=0,
                policy_kwargs=dict(features_extractor_class=CandidateEncoder,
                                   features_extractor_kwargs=dict(width=options.width),
                                   net_arch=dict(pi=[], vf=[64]), prior=options.prior))
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def train_ppo(env: gym.Env, options: PpoOptions) -> PPO:
    model = make_ppo(env, options)
    model.learn(total_timesteps=options.total_timesteps)
    return model


def num_policy_parameters(model: PPO) -> int:
    """Parameters of the actor (encoder and head), the part that would be deployed."""
    policy = model.policy
    return sum(p.numel() for p in list(policy.features_extractor.parameters()) + list(policy.action_net.parameters()))
