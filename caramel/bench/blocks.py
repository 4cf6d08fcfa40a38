"""How the bench times a block of steps, and the order runners take their turns in a round.

No barrier inside a measured block: `runner.entry_steps` unmeasured entry steps (so a strategy
that overlaps communication with the *next* forward is in its steady state), then `steps`
steps, each timed from the top of the loop to the top of the next iteration, exactly the time
a user's loop spends per iteration. `finish()` then drains what is still pending, unmeasured.
The entry steps are one more than the updates a step may leave outstanding (1 for bsp, DDP and
caramel; S + 1 under the ps strategy's `ssp:S`), so the untimed drain equals the backlog the
entry steps owed in and the window carries a steady block's transfers. A runner with no bound
(`asp`) sets `drain_timed`: no entry step, and the drain is charged to the last timed step, so
the window holds exactly its steps' updates, from an idle link to an idle link. The harness's
interleaved rounds and the reference's screening (`caramel.bench.screening`) both time this way.
"""
from __future__ import annotations

import time

from caramel.bench.baselines import Runner


def measure_block(runner: Runner, steps: int, stamps: list[list[float]] | None = None) -> list[float]:
    """Per-step times of `steps` steps in steady state (see the module docstring); with
    `stamps`, each step's wall-clock [start, end] is appended to it (a bandwidth trace's phases)."""
    for _ in range(runner.entry_steps):  # unmeasured
        runner.step()
    times: list[float] = []
    t_prev = time.perf_counter()
    wall_prev = time.time()
    for _ in range(steps):
        runner.step()
        t = time.perf_counter()
        times.append(t - t_prev)
        t_prev = t
        if stamps is not None:
            wall = time.time()
            stamps.append([wall_prev, wall])
            wall_prev = wall
    runner.finish()
    if runner.drain_timed and times:  # the block's updates drain inside the window, on its last step
        times[-1] += time.perf_counter() - t_prev
        if stamps is not None:
            stamps[-1][1] = time.time()
    return times


def round_order(keys: list, r: int) -> list:
    """The order of round `r`: `keys` rotated by `r`, so that drift and position effects hit
    every runner equally over the rounds."""
    return keys[r % len(keys):] + keys[:r % len(keys)]


def balanced_order(keys: list, r: int) -> list:
    """The order of screening round `r`: a serpentine of rotations (round 2k is `keys` rotated by
    2k, round 2k+1 the same reversed), so that over every pair of rounds each key's positions sum
    to len(keys) - 1: an even number of rounds gives every key the same mean position, whatever
    the number of keys (a rotation alone needs len(keys) rounds for that); the rotation by 2k
    hands the first slot to a different key in each of the first rounds."""
    order = round_order(keys, 2 * (r // 2))
    return order[::-1] if r % 2 else order
