"""The bench's compute jitter in the all-reduce simulator: a pause after each forward.

`caramel bench --jitter RANK:FRACTION[:SEED]` (`caramel.bench.hetero`) cannot make compute
faster, so every worker sleeps after its training forward: the jittered one (nominal x draw - 1)
x the pause unit, draw uniform in [1 - f, 1 + f] from `random.Random(seed)`, every other one
(nominal - 1) x it, nominal = 1 / (1 - f). The cluster says so in meta `compute_jitter` with
`"pause_after_forward": true` (`jitter_spec` below, which the gossip model reads too, so the
all-reduce and gossip predictions pause the same seconds at the same steps).

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

import random
import statistics

from caramel.errors import CaramelError, check_keys, is_int
from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec

JITTER_STEPS = 40  # steady steps unrolled under jitter (the gossip model's MIN_ITERATIONS)


def forward_pauses_s(profile: ModelProfile, cluster: ClusterSpec, steps: int) -> list[list[float]] | None:
    """Per rank and step, the bench's sleep after the forward in seconds, or None when the
    cluster carries no `compute_jitter` with `pause_after_forward` (the engine runs unchanged)."""
    if cluster.meta.get("compute_jitter") is None:
        return None
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


def jitter_factors(cluster: ClusterSpec, steps: int) -> tuple[list[list[float]], float | None]:
    """Per worker, per step, the draw (meta `compute_jitter`), and the nominal factor when the
    jitter is the bench's pause after the forward (module docstring), else None."""
    draws, nominal, _ = jitter_spec(cluster, steps)
    return draws, nominal


def jitter_spec(cluster: ClusterSpec, steps: int) -> tuple[list[list[float]], float | None, float | None]:
    """`jitter_factors` and the bench's pause unit in seconds (meta `compute_jitter.pause_unit_s`;
    None: the pause scales the profiled forward + backward)."""
    n = cluster.world_size
    out = [[1.0] * steps for _ in range(n)]
    raw = cluster.meta.get("compute_jitter")
    if raw is None:
        return out, None, None
    keys = ("rank", "fraction", "seed", "pause_after_forward", "pause_unit_s")
    check_keys(raw, keys, "cluster meta.compute_jitter")
    if "rank" not in raw or "fraction" not in raw:
        raise CaramelError(f"cluster meta.compute_jitter needs 'rank' and 'fraction', got {raw!r}")
    rank, frac, seed = raw["rank"], raw["fraction"], raw.get("seed", 0)
    pause = raw.get("pause_after_forward", False)
    if not is_int(rank) or not 0 <= rank < n:
        raise CaramelError(f"cluster meta.compute_jitter.rank must be an int in 0..{n - 1}, got {rank!r}")
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
        raise CaramelError(f"cluster meta.compute_jitter.fraction must be a number in [0, 1), got {frac!r}")
    if not is_int(seed):
        raise CaramelError(f"cluster meta.compute_jitter.seed must be an int, got {seed!r}")
    if not isinstance(pause, bool):
        raise CaramelError(f"cluster meta.compute_jitter.pause_after_forward must be true or false, got {pause!r}")
    unit = raw.get("pause_unit_s")
    if unit is not None and (isinstance(unit, bool) or not isinstance(unit, (int, float)) or not unit > 0
                             or unit == float("inf")):
        raise CaramelError(f"cluster meta.compute_jitter.pause_unit_s must be a finite number of seconds > 0 (the "
                           f"compute per step the bench's pause is a multiple of), got {unit!r}")
    if unit is not None and not pause:
        raise CaramelError("cluster meta.compute_jitter.pause_unit_s needs pause_after_forward: true (it sizes the "
                           "pause after the forward)")
    rng = random.Random(seed)
    out[rank] = [1.0 + rng.uniform(-frac, frac) for _ in range(steps)]
    return out, (1.0 / (1.0 - frac) if pause else None), (float(unit) if unit is not None else None)


