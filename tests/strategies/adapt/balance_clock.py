"""`balance="batch"`'s controller on a virtual clock: every rank's `Balancer` in a thread of one
process, the decisions' all-gather a barrier, each step's compute a known line per rank.

Rank r's compute at n samples is fixed_r + per_sample_r * n, times (1 + noise * z) with z a
standard normal drawn from (seed, step, rank), so every thread computes the same period (the
slowest rank's compute) and each rank's wait is the period less its own compute. A schedule
is a name per step (`schedules`); the first step under a new name is untimed (the adoption's
step) and under a name in `reads_wait_as_compute` a rank's wait reads as compute by that
fraction (forward overlap: a rank's waits partly fall inside its forward's hooks), and an
episode slows one rank's compute for a span of steps. `draw_ahead` has the loader draw that
many batches past the one running (prefetch); `resume_after` stops every rank after that step,
checkpoints its balancer (`balance_state`) and goes on with a fresh one loaded from it, its
first step untimed as a resumed process's is.
"""
from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import torch.nn as nn

from caramel.data.share_sampler import ShareSchedule
from caramel.runtime.stats import EngineStats
from caramel.strategies.caramel.balance_state import balancer_state, load_balancer_state


@dataclass
class Clock:
    costs_s: list[tuple[float, float]]  # per rank (fixed_s, per_sample_s)
    global_batch: int
    steps: int
    every: int = 10
    noise: float = 0.0  # relative SD of one step's compute
    seed: int = 0
    schedules: Callable[[int], str] = lambda step: "backward"
    reads_wait_as_compute: dict[str, float] = field(default_factory=dict)
    # (first step, last step, rank, factor): that rank's compute runs `factor` times as long then
    # (a warm-up, or another job taking the rank's core for a while)
    episodes: list[tuple[int, int, int, float]] = field(default_factory=list)
    draw_ahead: int = 0  # batches the loader has drawn past the one running
    resume_after: int | None = None  # the step after which every rank checkpoints and resumes

    def compute_s(self, step: int, rank: int, n: int) -> float:
        z = random.Random(f"{self.seed}:{step}:{rank}").gauss(0.0, 1.0)
        a, b = self.costs_s[rank]
        slow = 1.0
        for first, last, r, factor in self.episodes:
            if r == rank and first <= step <= last:
                slow *= factor
        return (a + b * n) * slow * max(1.0 + self.noise * z, 0.1)


def run(clock: Clock, balancer_cls) -> dict:
    """Every rank's balancer over `clock.steps` steps; returns the counts in force per step (one
    schedule: every rank's is the same) and rank 0's changes."""
    world = len(clock.costs_s)
    barrier, slots = threading.Barrier(world, timeout=30), [None] * world
    local = threading.local()

    def gather(out, mine, group=None):
        slots[local.rank] = mine
        barrier.wait()
        out[:] = list(slots)
        barrier.wait()

    results: list[dict | None] = [None] * world
    errors: list[BaseException] = []

    def rank_loop(rank: int) -> None:
        local.rank = rank
        def fresh():
            engine = SimpleNamespace(stats=EngineStats(), remove_at_release=lambda *h: None,
                                     recorder=SimpleNamespace(now=lambda: 0.0), count_wait=lambda s: None,
                                     plan=None, overlap=None, delegating=False)
            b = balancer_cls(engine, nn.Linear(1, 1), None, rank, world, clock.every)
            b.attach(ShareSchedule(clock.global_batch, world))
            return engine, b
        engine, b = fresh()
        plans: dict[str, object] = {}
        counts, last = [], None
        try:
            for step in range(clock.steps):
                name = clock.schedules(step)
                engine.plan = plans.setdefault(name, object())
                engine.overlap = name
                ns = b.schedule.counts_for(step)
                b.schedule.drawn = step + 1 + clock.draw_ahead
                b.local_batch = ns[rank]
                computes = [clock.compute_s(step, r, ns[r]) for r in range(world)]
                period = max(computes)
                wait = period - computes[rank]
                wait *= 1.0 - clock.reads_wait_as_compute.get(name, 0.0)
                engine.stats.last_step_s, engine.stats.last_wait_s = period, wait
                counts.append(list(ns))
                b.step_end(timed=name == last)
                last = name
                if step == clock.resume_after:
                    state = balancer_state(b, rank, world)
                    engine, b = fresh()
                    load_balancer_state(b, state, rank, world)
                    last = None
            results[rank] = {"counts": counts, "changes": list(b.changes)}
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)
            barrier.abort()

    module = sys.modules[balancer_cls._decide.__module__]  # where the decision (and its `dist`) is, a subclass too
    real = module.dist
    module.dist = SimpleNamespace(all_gather_object=gather)  # the decisions' only collective
    try:
        threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        module.dist = real
    if errors:
        raise errors[0]
    return results[0]


def predicted_s(costs_s: list[tuple[float, float]], counts: list[int]) -> float:
    return max(a + b * n for (a, b), n in zip(costs_s, counts))
