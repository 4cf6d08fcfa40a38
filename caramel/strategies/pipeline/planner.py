"""PipeDream's partitioner: stage boundaries and replicas per stage from per-layer costs.

PipeDream (SOSP'19, section 3.1) picks, by dynamic program over layers and workers, the split
whose slowest stage is fastest, since in steady state a pipeline runs at its slowest stage's pace.

    A(j, m) = min( T(0..j, m),                                   one stage, m replicas
                   min over i < j, 1 <= m' < m of
                       max(A(i, m - m'), C(i), T(i..j, m')) )    last stage i..j on m' workers
    T(a..b, r) = max(compute(a..b), allreduce(params(a..b), r)) / r
    C(i)       = activation out of layer i-1 forward + its gradient back, over one link

`balanced_boundaries` handles uneven workers (one per stage, no replicas): stage k runs on the
k-th worker, whose compute time is the layer time divided by its measured speed. Both have brute
force twins for the tests. `LayerCost`s come from caramel's `ModelProfile`
(`layer_costs_from_profile`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec


@dataclass(frozen=True)
class LayerCost:
    """One layer (one child of the `nn.Sequential`), per microbatch."""

    forward_s: float
    backward_s: float
    output_bytes: int  # the activation it hands the next layer (its gradient comes back alike)
    param_bytes: int

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class ScalingCost:
    """One layer's cost at any microbatch size: fixed per microbatch plus per sample."""

    fixed_forward_s: float
    per_sample_forward_s: float
    fixed_backward_s: float
    per_sample_backward_s: float
    output_bytes_per_sample: float
    param_bytes: int

    def at(self, samples: float) -> LayerCost:
        return LayerCost(self.fixed_forward_s + self.per_sample_forward_s * samples,
                         self.fixed_backward_s + self.per_sample_backward_s * samples,
                         int(self.output_bytes_per_sample * samples), self.param_bytes)


def fit_scaling(small: list[LayerCost], small_samples: int, large: list[LayerCost], large_samples: int) -> list[ScalingCost]:
    """Per layer, the line through its measured times at two microbatch sizes. Noise can tilt
    a line below zero at either end; the fixed part is kept within [0, the smaller time] and the
    per-sample part non-negative, so no size is ever predicted to cost less than nothing."""
    if len(small) != len(large) or not 0 < small_samples < large_samples:
        raise CaramelError(f"fit_scaling: need the same layers at two sizes small < large, got {len(small)} layers at "
                           f"{small_samples} and {len(large)} at {large_samples}")

    def line(t_small: float, t_large: float) -> tuple[float, float]:
        slope = max(0.0, (t_large - t_small) / (large_samples - small_samples))
        fixed = min(max(0.0, t_small - slope * small_samples), t_small)
        return fixed, slope

    out = []
    for s, g in zip(small, large):
        ff, fs = line(s.forward_s, g.forward_s)
        bf, bs = line(s.backward_s, g.backward_s)
        out.append(ScalingCost(ff, fs, bf, bs, g.output_bytes / large_samples, g.param_bytes))
    return out


@dataclass(frozen=True)
class PartitionPlan:
    boundaries: list[int]  # first layer of stages 1..; [] for one stage
    replicas: list[int]  # data-parallel copies of each stage
    stage_times_s: list[float]  # predicted time per microbatch of each stage (replicas included)
    transfer_times_s: list[float]  # predicted activation + gradient transfer at each boundary

    @property
    def slowest_s(self) -> float:
        """The predicted pace of the pipeline: its slowest stage or link, per microbatch."""
        return max(self.stage_times_s + self.transfer_times_s)

    @property
    def slowest_stage(self) -> int:
        return max(range(len(self.stage_times_s)), key=self.stage_times_s.__getitem__)


def transfer_time_s(nbytes: int, cluster: ClusterSpec) -> float:
    """Activation forward and its gradient back over one link."""
    return 2 * (cluster.latency_s + nbytes * 8 / cluster.bandwidth_bps)


def message_cpu_s(cluster: ClusterSpec) -> float:
    """The CPU one point-to-point message costs a rank at one of its ends (its send, or its
    recv), from the spec's per-collective pause: `collective_cpu_s` is the extra CPU of sending
    the same bytes as one more all-reduce (`caramel.topology.probe.measure_queued_extra`, times
    the ranks per shared core), and gloo's ring all-reduce over n ranks sends 2(n - 1) messages
    and receives as many on every rank, so each end costs collective_cpu_s / (4 (n - 1)).
    (The collective's own hand-off to the backend's thread is spread over its messages too: no
    finer split is measured.) 0 for a spec of one worker or without the pause."""
    n = cluster.world_size
    return cluster.collective_cpu_s / (4 * (n - 1)) if n > 1 else 0.0


def stage_time_s(layers: list[LayerCost], replicas: int, cluster: ClusterSpec, speed: float = 1.0) -> float:
    """PipeDream's T: a stage's compute or its replicas' weight sync, whichever is longer, shared
    by its replicas (each runs 1/replicas of the microbatches)."""
    compute = sum(c.compute_s for c in layers) / speed
    sync = ClusterSpec.uniform(replicas, cluster.bandwidth_bps, cluster.latency_s).allreduce_time_s(
        sum(c.param_bytes for c in layers))
    return max(compute, sync) / replicas


def pipedream_partition(costs: list[LayerCost], cluster: ClusterSpec, max_stages: int | None = None) -> PartitionPlan:
    """The dynamic program above over at most `cluster.world_size` workers (and at most
    `max_stages` stages); returns the fastest plan, replicas per stage included."""
    n_layers, n_workers = len(costs), cluster.world_size
    if n_layers < 1:
        raise CaramelError("pipeline: the model has no layers to partition")
    max_stages = max_stages or n_workers

    @lru_cache(maxsize=None)
    def best(j: int, m: int, s: int) -> tuple[float, tuple[tuple[int, int], ...]]:
        """Layers [0, j) on exactly m workers in at most s stages: (slowest, ((start, replicas), ...))."""
        top = (stage_time_s(costs[:j], m, cluster), ((0, m),))
        if s == 1:
            return top
        for i in range(1, j):
            link = transfer_time_s(costs[i - 1].output_bytes, cluster)
            for mp in range(1, m):
                head, stages = best(i, m - mp, s - 1)
                t = max(head, link, stage_time_s(costs[i:j], mp, cluster))
                if t < top[0]:
                    top = (t, stages + ((i, mp),))
        return top

    _, stages = min((best(n_layers, m, max_stages) for m in range(1, n_workers + 1)), key=lambda r: r[0])
    return _plan(costs, cluster, [s for s, _ in stages[1:]], [r for _, r in stages])


def brute_force_partition(costs: list[LayerCost], cluster: ClusterSpec, max_stages: int | None = None) -> PartitionPlan:
    """Every split and every replica assignment (small inputs only): the test oracle."""
    n, w = len(costs), cluster.world_size
    best_plan = None
    for k in range(1, min(n, max_stages or w) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            for reps in itertools.product(range(1, w + 1), repeat=k):
                if sum(reps) > w:
                    continue
                plan = _plan(costs, cluster, list(cuts), list(reps))
                if best_plan is None or plan.slowest_s < best_plan.slowest_s:
                    best_plan = plan
    assert best_plan is not None
    return best_plan


def balanced_boundaries(costs: list[LayerCost], speeds: list[float], cluster: ClusterSpec) -> PartitionPlan:
    """One stage per worker, in order, worker k `speeds[k]` times as fast as the reference:
    the cut that minimizes the slowest stage or link (dynamic program, O(layers^2 x stages)).
    Among equally slow cuts (one layer much slower than the rest ties many), the one whose links
    take the least time in all: the fewest bytes on the wire."""
    n, k = len(costs), len(speeds)
    if k > n:
        raise CaramelError(f"pipeline: {k} stages need at least {k} layers, the model has {n}")
    if any(s <= 0 for s in speeds):
        raise CaramelError(f"pipeline: worker speeds must be positive, got {speeds}")

    @lru_cache(maxsize=None)
    def best(j: int, s: int) -> tuple[float, float, tuple[int, ...]]:
        """Layers [0, j) on workers [0, s): (slowest, links' total, cuts), least in that order
        (the slowest exactly; the total is a tie-break)."""
        if s == 1:
            return stage_time_s(costs[:j], 1, cluster, speeds[0]), 0.0, ()
        top = (float("inf"), float("inf"), ())
        for i in range(s - 1, j):
            head, links, cuts = best(i, s - 1)
            link = transfer_time_s(costs[i - 1].output_bytes, cluster)
            t = max(head, link, stage_time_s(costs[i:j], 1, cluster, speeds[s - 1]))
            if (t, links + link) < top[:2]:
                top = (t, links + link, cuts + (i,))
        return top

    _, _, cuts = best(n, k)
    return _plan(costs, cluster, list(cuts), [1] * k, speeds)


def brute_force_balanced(costs: list[LayerCost], speeds: list[float], cluster: ClusterSpec) -> PartitionPlan:
    plans = [_plan(costs, cluster, list(c), [1] * len(speeds), speeds)
             for c in itertools.combinations(range(1, len(costs)), len(speeds) - 1)]
    return min(plans, key=lambda p: p.slowest_s)


def _plan(costs: list[LayerCost], cluster: ClusterSpec, cuts: list[int], replicas: list[int],
          speeds: list[float] | None = None) -> PartitionPlan:
    edges = [0, *cuts, len(costs)]
    speeds = speeds or [1.0] * len(replicas)
    times = [stage_time_s(costs[a:b], r, cluster, sp)
             for (a, b), r, sp in zip(zip(edges[:-1], edges[1:]), replicas, speeds)]
    links = [transfer_time_s(costs[c - 1].output_bytes, cluster) for c in cuts]
    return PartitionPlan(cuts, replicas, times, links)


def layer_costs_from_profile(profile: ModelProfile, model: nn.Sequential, sample: torch.Tensor) -> list[LayerCost]:
    """One `LayerCost` per child of `model`: forward and backward time summed over the profiled
    modules under that child (per microbatch of `sample`'s size: the profile's batch is scaled
    by the sample's), parameter bytes from the child, activation bytes from one shape pass."""
    names = [name for name, _ in model.named_children()]
    fwd, bwd = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    for m in profile.modules:
        top = m.name.split(".")[0]
        if top in fwd:
            fwd[top] += m.forward_time_s
            bwd[top] += m.backward_time_s
    scale = sample.shape[0] / profile.batch_size
    out_bytes = []
    with torch.no_grad():
        x = sample
        for child in model.children():
            x = child(x)
            out_bytes.append(x.numel() * x.element_size())
    return [LayerCost(fwd[n] * scale, bwd[n] * scale, ob, sum(p.numel() * p.element_size() for p in c.parameters()))
            for n, c, ob in zip(names, model.children(), out_bytes)]
