"""The shared host's noise for the virtual clock (`balance_clock.Clock`), drawn from run 9's records.

`experiments/balance_host_spells.py` measured, in every balanced run of run 9
(docs/results/adapt-balance-host-spells.json, `model`): each rank's step noise around its cost
line, its slow (and fast) spells of 5-35 steps at 10-60% off the line, single-step spikes, and
how many passes the overlap trial ran (1 to 4). `host_clock` turns one seed into a `Clock` with
those: the step noise as the clock's noise, every spell and spike an episode of one rank (each
rank independently: per step a spell starts with the measured rate while none runs, its length
and size drawn from the measured ones), and the trial's blocks repeated for the drawn number of
passes. `spells=False` leaves spells and spikes out (the same seed's step noise and passes).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from tests.strategies.adapt.balance_clock import Clock

MODEL_FILE = Path(__file__).resolve().parents[3] / "docs" / "results" / "adapt-balance-host-spells.json"
TRIAL_FIRST_STEP = 5
# one pass of the overlap trial: (schedule, first step, last step) from TRIAL_FIRST_STEP
PASS = [("forward", 0, 4), ("backward", 5, 9), ("ddp", 10, 19), ("backward2", 20, 24), ("forward2", 25, 29)]
PASS_STEPS = 30
FORWARD_READS = {"forward": 0.5, "forward2": 0.5}  # the share of a rank's wait its forward hides


def load_model(path: Path = MODEL_FILE) -> dict:
    data = json.loads(path.read_text())
    if data.get("format") != "caramel.balance-host-spells/1":
        raise ValueError(f"{path}: expected format caramel.balance-host-spells/1, found {data.get('format')!r}")
    return data["model"]


def trial_schedule(passes: int):
    """The schedule name per step for an overlap trial that ran `passes` passes (backward after)."""
    def name(step: int) -> str:
        if step < TRIAL_FIRST_STEP:
            return "profiling"
        k = step - TRIAL_FIRST_STEP
        if k >= passes * PASS_STEPS:
            return "backward3"
        k %= PASS_STEPS
        return next(n for n, first, last in PASS if first <= k <= last)
    return name


def host_episodes(model: dict, seed: int, world: int, steps: int) -> list[tuple[int, int, int, float]]:
    """Spells and spikes of each rank, (first step, last step, rank, factor), from `seed`."""
    out = []
    for rank in range(world):
        rng = random.Random(f"host-spells:{seed}:{rank}")
        step = TRIAL_FIRST_STEP
        while step < steps:
            if rng.random() < model["spell_start_per_rank_step"]:
                length = rng.choice(model["spell_steps"])
                out.append((step, step + length - 1, rank, 1.0 + rng.choice(model["spell_sizes"])))
                step += length
                continue
            if rng.random() < model["spike_per_rank_step"]:
                out.append((step, step, rank, 1.0 + rng.choice(model["spike_sizes"])))
            step += 1
    return out


def host_clock(costs_s: list[tuple[float, float]], global_batch: int, steps: int, seed: int,
               spells: bool = True, model: dict | None = None, **kw) -> Clock:
    """A `Clock` with the host's noise drawn from `seed` (module docstring)."""
    model = model if model is not None else load_model()
    passes = random.Random(f"host-passes:{seed}").choice(model["trial_passes"])
    episodes = host_episodes(model, seed, len(costs_s), steps) if spells else []
    return Clock(costs_s, global_batch, steps, noise=model["step_noise_sd"], seed=seed,
                 schedules=trial_schedule(passes), reads_wait_as_compute=FORWARD_READS,
                 episodes=episodes, **kw)
