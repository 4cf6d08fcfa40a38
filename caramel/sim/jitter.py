"""The bench's compute jitter in the all-reduce simulator: a pause after each forward.

`caramel bench --jitter RANK:FRACTION[:SEED]` (`caramel.bench.hetero`) cannot make compute
faster, so every worker sleeps after its training forward: the jittered one (nominal x draw - 1)
x the pause unit, draw uniform in [1 - f, 1 + f] from `random.Random(seed)`, every other one
(nominal - 1) x it, nominal = 1 / (1 - f). The cluster says so in meta `compute_jitter` with
`"pause_after_forward": true` (`caramel.strategies.gossip.links`, whose draws and pause units
this reads, so the all-reduce and gossip predictions pause the same seconds at the same steps).

In the event engine the pause sits between a worker's forward and its backward: a sleep, not
compute, so transfers in flight do not slow it and a collective that starts during it costs
the worker no CPU (`run_engine`'s `pause_s`). It hides no communication: a synchronous
all-reduce (DDP, backward overlap) has nothing in flight before the backward issues its
buckets, and with forward overlap every lazy update of the step before is waited for inside
the forward, before the pause. What it changes is when each worker issues its buckets: every
collective starts once the last worker issued it, so each step waits for the slowest draw.

The step the prediction reports is the mean over `JITTER_STEPS` steady steps of how far the
slowest worker's clock advanced (`job_steps_s`): the bench's T is the median over rounds of
each round's mean step (`caramel.bench.step_metrics.round_means`), which a round's mean of the
per-step maximum estimates (E[max] over the workers' pauses). The per-step median would not:
half the draws fall below 1, where the others' padding is the step's longest pause, so it sits
at the step without jitter. Both are in the result's meta. The jitter that scales compute
(`compute_jitter` without `pause_after_forward`) is not modelled here.
"""
from __future__ import annotations

import statistics

from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec

JITTER_STEPS = 40  # steady steps unrolled under jitter (the gossip model's MIN_ITERATIONS)


def forward_pauses_s(profile: ModelProfile, cluster: ClusterSpec, steps: int) -> list[list[float]] | None:
    """Per rank and step, the bench's sleep after the forward in seconds, or None when the
    cluster carries no `compute_jitter` with `pause_after_forward` (the engine runs unchanged)."""
    if cluster.meta.get("compute_jitter") is None:
        return None
    from caramel.strategies.gossip.links import jitter_spec  # the same draws and checks as gossip's

    draws, nominal, unit_s = jitter_spec(cluster, steps)
    if nominal is None:
        return None
    fb_s = profile.forward_time_s + profile.backward_time_s
    units = [unit_s if unit_s is not None else fb_s / w.speed for w in cluster.workers]
    return [[max(nominal * d - 1.0, 0.0) * u for d in row] for row, u in zip(draws, units)]


def job_steps_s(forward_starts_s: list[list[float]], warm: int = 1) -> list[float]:
    """Per step from `warm` on, how far the slowest worker's clock (its forward starts) advanced."""
    job = [max(fs[k] for fs in forward_starts_s) for k in range(warm, len(forward_starts_s[0]))]
    return [b - a for a, b in zip(job, job[1:])]


def jitter_summary(steps_s: list[float]) -> dict[str, float]:
    return {"job_step_mean_s": statistics.fmean(steps_s), "job_step_median_s": statistics.median(steps_s),
            "jitter_steps": len(steps_s)}
