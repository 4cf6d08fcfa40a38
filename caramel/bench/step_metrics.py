"""Bench arithmetic: a job's step times from its ranks' raw times, and the metrics on top of them.

Definitions (shared/DESIGN.md, "Metrics everyone uses here"):

- a job's step time is, per step index, how far the slowest rank's clock advanced: the job
  progresses as fast as its slowest rank, so its clock after step k is the largest of the
  ranks' cumulative times, and step k takes the difference. T = the median of those steps, p90
  their 90th percentile. Not the slowest rank's time per step index: a step boundary is not a
  synchronization point (with forward overlap a rank waits for its peers in the next forward),
  and ranks running in opposite phase would have one delay counted once on each rank;
- T_comm is the median of the comm-only baseline; T_compute is the median over rounds of the
  compute-only baseline's pace, the slowest rank's mean step in the round: its ranks never wait
  for one another, so with more workers than cores the per-step series would take most of its
  steps from whichever rank happened to run alone on a core;
- U = T_compute + T_comm (no overlap), L = max(T_compute, T_comm) (perfect overlap);
  exposed communication = max(T - T_compute, 0); efficiency E = (U - T) / (U - L);
- T_concurrent is the concurrent baseline (all of a step's communication beside all of its
  compute, independent): perfect overlap as this host runs it, contention included;
- the estimated ceiling is max(bound, min(T_concurrent, U)): the simulator's lower bound has the
  dependencies but no contention, T_concurrent the contention but no dependencies, U what no
  overlap at all costs; a schedule pays for both, so it is not expected to beat the ceiling;
- the reference of a configuration is the stronger (lower median) of the DDP variants measured
  in it (`ddp`, `ddp:comm_priority=realtime`, whose threads get the priority the engine gives
  its own, and `ddp:bucket_cap_mb=tuned,comm_priority=realtime`, whose bucket cap the job
  screened first, caramel.bench.screening): speedup = T_ref / T, with its 95% interval from the paired rounds
  (caramel.stats.paired_ratio_interval), and the share of the possible gain captured is
  (T_ref - T) / (T_ref - ceiling);
- a point's regime is the one its target comm/compute stands for (measured comm/compute for a
  pinned rate): below 0.75 compute-bound, up to 1.5 balanced, above that communication-bound.
  The summary takes the geomean speedup and the median share over balanced and comm-bound
  points, and the worst speedup over all.
"""
from __future__ import annotations

import math

from caramel.bench.matrix import regime_of_ratio
from caramel.trace import metrics

REFERENCE_KIND = "ddp"
"""strategies of this kind are the reference candidates: the stronger of them is every row's baseline"""


def job_step_times(rank_times: list[list[float]], steps_per_round: int | None = None) -> list[float]:
    """Per step index, how far the slowest rank's clock advanced (module docstring); the clocks
    start together at each round of `steps_per_round` steps (default: one round)."""
    assert rank_times and all(len(t) == len(rank_times[0]) for t in rank_times), "ranks must time the same steps"
    n = len(rank_times[0])
    block = steps_per_round or n or 1
    out: list[float] = []
    for start in range(0, n, block):
        clocks = [0.0] * len(rank_times)
        job = 0.0
        for k in range(start, min(start + block, n)):
            for r, ts in enumerate(rank_times):
                clocks[r] += ts[k]
            step = max(clocks) - job
            job += step
            out.append(step)
    return out


def round_means(steps: list[float], steps_per_round: int | None = None) -> list[float]:
    """The mean of each round of `steps_per_round` steps (default: one round) of a job's series:
    over a round, `job_step_times` adds up to the slowest rank's time for the round."""
    block = steps_per_round or len(steps) or 1
    return [sum(steps[i:i + block]) / len(steps[i:i + block]) for i in range(0, len(steps), block)]


def free_running_pace_s(rank_times: list[list[float]], steps_per_round: int | None = None) -> list[float]:
    """Per round, the slowest rank's mean step: the pace of ranks that never synchronize (the
    compute-only baseline; module docstring)."""
    return round_means(job_step_times(rank_times, steps_per_round), steps_per_round)


def efficiency(step_s: float, compute_s: float, comm_s: float) -> float | None:
    """E = (U - T) / (U - L); None when U == L (nothing to overlap: one of the two is zero)."""
    e = metrics.scheduling_efficiency(step_s, compute_s, comm_s)
    return None if math.isnan(e) else e


def regime_of(comm_s: float, compute_s: float) -> str:
    """The measured regime: comm/compute of the baselines."""
    return regime_of_ratio(comm_s / compute_s)


def reference_of(medians: dict[str, float], kinds: dict[str, str]) -> str | None:
    """The stronger DDP variant: the lowest median among measured strategies of REFERENCE_KIND
    (the first listed on a tie); None when no DDP variant was measured."""
    candidates = [n for n in medians if kinds.get(n) == REFERENCE_KIND]
    return min(candidates, key=lambda n: medians[n]) if candidates else None


def share_captured(reference_s: float | None, step_s: float | None, ceiling: float | None) -> float | None:
    """(T_ref - T) / (T_ref - ceiling): 1 at the ceiling, 0 at the reference, negative when slower;
    None without a ceiling or when the reference is already at (or below) it."""
    if reference_s is None or step_s is None or ceiling is None or reference_s - ceiling <= 0:
        return None
    return (reference_s - step_s) / (reference_s - ceiling)


def estimated_ceiling_s(lower_bound: float | None, concurrent: float | None, compute: float, comm: float) -> float | None:
    """max(bound, min(T_concurrent, U)) (module docstring), or None without both inputs."""
    if concurrent is None or lower_bound is None:
        return None
    return max(lower_bound, min(concurrent, compute + comm))
