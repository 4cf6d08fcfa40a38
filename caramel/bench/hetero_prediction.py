"""A heterogeneous configuration's inputs to the predictions' cluster, and which simulators take them.

The bench's predictions (`caramel.bench.prediction`) build one ClusterSpec from the baselines.
A configuration with `--slow-link`, `--jitter` or `--slow-worker` (`caramel.bench.hetero`,
`caramel.bench.straggler`) ran on uneven workers, and the cluster says so:

- slow worker: each worker's `speed` is the profile's step over its own compute-only median
  (`prediction.worker_speeds`), which the calibrated delay slows: every simulator reads it;
- slow link: meta `worker_bandwidth_bps`, each worker's rate in the ratio the emulated cluster
  shapes the veths (`hetero.link_rates_bps`: both directions of that worker's veth at the
  others' rate / FACTOR), scaled so that the slowest is the achieved rate of the comm-only
  baseline: a ring all-reduce runs at its slowest link's rate, so that rate is the slow link's
  and the others achieve FACTOR times it. The cluster's own `bandwidth_bps` stays the achieved
  rate: the all-reduce models (ddp, caramel), which read one rate, get the ring's bottleneck
  as measured; the gossip model reads the list; the others (ps, pipeline) price every link at
  the bottleneck and are marked as ignoring the slow link;
- jitter: meta `compute_jitter` with the same rank, fraction and seed, `pause_after_forward:
  true` (the bench's emulation: a sleep after the forward) and `pause_unit_s`, the calibrated
  compute per step the bench's sleep is a multiple of (the calibration per sample x the local
  batch), so that the simulator pauses each step for what the bench sleeps, (nominal x draw - 1)
  x it, for the simulators that read it (gossip; ddp and caramel, whose all-reduce waits each
  step for the longest pause: `caramel.sim.jitter`). Their workers' speeds come from the unpadded
  compute: each rank's compute-only median of its measured steps less each step's own pause
  (the harness records the sleeps, `unpadded_median_s`), so the jittered rank's draws in the
  baseline's steps are taken out as they fell. Files from before that record only the padded
  medians: every rank but the jittered one less the median pause, (nominal - 1) x the
  calibration, and the jittered rank at the others' median (the ranks do the same work; its
  own draws are not known). When a pause is at least the measured compute (a calibration far
  off the measurement), no unpadded speed can be derived: those predictions run on the
  padded medians and are marked as ignoring the jitter. The other simulators (ps, pipeline)
  get the padded medians (the mean padding is in them, the per-step variance is not) and are
  marked as ignoring the jitter.

A prediction that ignores an input carries `ignores` (the record's `prediction_ignores`), and
the report marks its row instead of counting it toward the simulator's accuracy or the
recommendation check.

Assumptions (docs/benchmarks.md, limits): the fast links achieve FACTOR x the measured
bottleneck, i.e. the same share of their shaped rate as the slow one (gloo on a small host's
cores may reach less at the higher rate); and the gossip model's flow share (`push_efficiency`,
measured by the traffic probe at the bottleneck's rate) is applied unchanged to the fast links.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from caramel.bench.hetero import link_rates_bps, nominal_factor
from caramel.errors import CaramelError, check_keys, is_int
from caramel.stats import median
from caramel.strategies.reads import INPUTS, ignored_by, reads

JITTER_KEYS = ("rank", "fraction", "seed", "compute_per_sample_s")  # what the jitter's pause needs


def unpadded_median_s(step_times_s: list[float], paused_s: list[float], steps_per_round: int) -> float:
    """One rank's compute-only median without the jitter: each measured step less the pause it
    slept. `paused_s` holds one pause per step the compute-only runner took since it started
    measuring, blocks of an unmeasured entry step and `steps_per_round` measured ones
    (`caramel.bench.blocks.measure_block`), so the entry steps are dropped to align them."""
    measured = [p for i, p in enumerate(paused_s) if i % (steps_per_round + 1)]
    if len(measured) != len(step_times_s):
        raise CaramelError(f"{len(measured)} recorded pauses for {len(step_times_s)} compute-only steps: the "
                           "pauses do not align with the steps")
    return median([t - p for t, p in zip(step_times_s, measured)])


def job_heterogeneity(slow_link: list | None, jitter: dict[str, Any] | None, slow_worker: dict[str, Any] | None,
                      local_batch: int, compute_step_times_s: list[list[float]], paused_s: list,
                      concurrent_padding: list, steps_per_round: int) -> Heterogeneity:
    """A job's `Heterogeneity` from what its ranks gathered: with a jitter, each rank's
    unpadded compute-only median (`unpadded_median_s`) and its concurrent steps' paddings,
    which together give the "jitter" cluster its contention factor
    (`caramel.bench.prediction.contention_factors`)."""
    return Heterogeneity(slow_link=slow_link, jitter=jitter, slow_worker=slow_worker, local_batch=local_batch,
                         unpadded_compute_s=[unpadded_median_s(t, p, steps_per_round)
                                             for t, p in zip(compute_step_times_s, paused_s)] if jitter else None,
                         concurrent_pauses=[[list(p) for p in r] for r in concurrent_padding] if jitter else None)


@dataclass
class Heterogeneity:
    """What made a configuration's workers uneven, as the job measured it."""

    slow_link: list | None = None
    """`[rank, factor]`: that worker's veth at the others' rate / factor"""
    jitter: dict[str, Any] | None = None
    """`runners.jitter_of`'s dict: rank, fraction, seed, compute_per_sample_s (the calibration), nominal_factor"""
    slow_worker: dict[str, Any] | None = None
    """`runners.slow_worker_of`'s dict: rank, factor, the calibrated delay"""
    local_batch: int | None = None
    """samples per worker and step (the jitter's pause is per sample)"""
    unpadded_compute_s: list[float] | None = None
    """per rank, the compute-only median less each measured step's own pause (`unpadded_median_s`)"""
    concurrent_pauses: list | None = None
    """per rank, per concurrent-baseline step, its padding (`caramel.bench.contention.span_padding`:
    slept_s, slept_in_overlap_s, collectives_started); the name is the saved inputs' key, kept so
    that files already written read back"""

    def contention_inputs(self, rank_compute_s: list[float], spans: list) -> tuple[list[float], list]:
        """The compute-only medians and concurrent spans the contention factor takes: unpadded
        when the job recorded both paddings (`caramel.bench.contention`), as given when it
        recorded none; one without the other is an error."""
        if self.concurrent_pauses is None:
            return rank_compute_s, spans
        _check_padding(self.concurrent_pauses, self.unpadded_compute_s)
        from caramel.bench.contention import unpadded_spans
        if len(self.concurrent_pauses) != len(spans):
            raise CaramelError(f"heterogeneity.concurrent_pauses lists {len(self.concurrent_pauses)} ranks, expected "
                               f"one per rank's spans ({len(spans)})")
        try:
            return list(self.unpadded_compute_s), [unpadded_spans(s, p) for s, p in zip(spans, self.concurrent_pauses)]
        except ValueError as e:
            raise CaramelError(f"heterogeneity.concurrent_pauses: {e}") from None

    def present(self) -> list[str]:
        return [k for k in INPUTS if getattr(self, k)]

    def ignored_by(self, name: str) -> list[str]:
        """The inputs present that strategy `name`'s simulator does not take."""
        return ignored_by(name, self.present())

    def reads_jitter(self, name: str) -> bool:
        return bool(self.jitter) and "jitter" in reads(name)

    def worker_bandwidth_bps(self, world: int, bottleneck_bps: float) -> list[float] | None:
        """Each worker's rate (module docstring), the slowest at `bottleneck_bps`; None without a slow link."""
        if not self.slow_link:
            return None
        _check_rank(self.slow_link[0], world, "slow_link")
        shaped = link_rates_bps(1.0, world, self.slow_link)
        return [bottleneck_bps * r / min(shaped) for r in shaped]

    def pause_unit_s(self) -> float:
        """The calibrated compute per step the jitter's sleep is a multiple of (module docstring)."""
        j = self.jitter
        if not j:
            return 0.0
        if not self.local_batch:
            raise CaramelError("heterogeneity.local_batch: the jitter's pause needs the local batch (samples per "
                               f"worker and step, an integer >= 1), got {self.local_batch!r}")
        return j["compute_per_sample_s"] * self.local_batch

    def pause_s(self) -> float:
        """A worker not jittered's pause after the forward per step: (nominal - 1) x the calibrated compute."""
        return (nominal_factor(self.jitter["fraction"]) - 1.0) * self.pause_unit_s() if self.jitter else 0.0

    def unpadded_compute_s_of(self, rank_compute_s: list[float]) -> tuple[list[float] | None, str | None]:
        """Each rank's compute-only median without the jitter's padding (module docstring), or
        None and why when a pause is at least the measured compute."""
        world = len(rank_compute_s)
        if self.unpadded_compute_s is not None:
            if len(self.unpadded_compute_s) != world:
                raise CaramelError(f"heterogeneity.unpadded_compute_s lists {len(self.unpadded_compute_s)} ranks, "
                                   f"expected one per worker ({world})")
            out = list(self.unpadded_compute_s)
        else:
            rank = _check_rank(self.jitter["rank"], world, "jitter")
            pause = self.pause_s()
            out = [c - pause for c in rank_compute_s]
            others = [u for r, u in enumerate(out) if r != rank]
            if others:  # the jittered rank's own draws are not known: the others do the same work
                out[rank] = median(others)
        bad = [r for r, u in enumerate(out) if u <= 0]
        if bad:
            return None, (f"the jitter's pause ({1e3 * self.pause_s():.1f} ms at the median) is at least rank(s) "
                          f"{', '.join(map(str, bad))}'s measured compute-only median: no unpadded speed")
        return out, None

    def compute_jitter(self) -> dict[str, Any] | None:
        """The gossip simulator's meta `compute_jitter` for the bench's emulation."""
        j = self.jitter
        if not j:
            return None
        return {"rank": int(j["rank"]), "fraction": float(j["fraction"]), "seed": int(j["seed"]),
                "pause_after_forward": True, "pause_unit_s": self.pause_unit_s()}

    def check(self, world: int) -> "Heterogeneity":
        """Every rank within `world` (CaramelError naming the input otherwise)."""
        for key in ("slow_link", "jitter", "slow_worker"):
            value = getattr(self, key)
            if value:
                _check_rank(value[0] if key == "slow_link" else value["rank"], world, key)
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Heterogeneity":
        """From `to_dict` (a record's `prediction_inputs.heterogeneity`); CaramelError naming a bad input."""
        data = data or {}
        check_keys(data, FIELDS, "heterogeneity")
        link, jitter, slow = data.get("slow_link"), data.get("jitter"), data.get("slow_worker")
        if link is not None and not (isinstance(link, (list, tuple)) and len(link) == 2 and is_int(link[0])
                                     and _is_num(link[1]) and link[1] >= 1):
            raise CaramelError(f"heterogeneity.slow_link must be [rank, factor >= 1], got {link!r}")
        if jitter is not None:
            if not isinstance(jitter, dict) or any(k not in jitter for k in JITTER_KEYS):
                raise CaramelError(f"heterogeneity.jitter must be a dict with at least {', '.join(JITTER_KEYS)}, "
                                   f"got {jitter!r}")
            if not (is_int(jitter["rank"]) and _is_num(jitter["fraction"]) and 0 < jitter["fraction"] < 1
                    and is_int(jitter["seed"]) and _is_num(jitter["compute_per_sample_s"])
                    and jitter["compute_per_sample_s"] > 0):
                raise CaramelError("heterogeneity.jitter needs an int rank, a fraction in (0, 1), an int seed and a "
                                   f"compute_per_sample_s > 0, got {jitter!r}")
        if slow is not None and not (isinstance(slow, dict) and is_int(slow.get("rank"))):
            raise CaramelError(f"heterogeneity.slow_worker must be a dict with an int rank, got {slow!r}")
        batch = data.get("local_batch")
        if batch is not None and not (is_int(batch) and batch >= 1):
            raise CaramelError(f"heterogeneity.local_batch must be an integer >= 1, got {batch!r}")
        unpadded = data.get("unpadded_compute_s")
        if unpadded is not None and not (isinstance(unpadded, list) and all(_is_num(u) for u in unpadded)):
            raise CaramelError(f"heterogeneity.unpadded_compute_s must list one number per rank, got {unpadded!r}")
        padding = data.get("concurrent_pauses")
        if padding is not None:
            _check_padding(padding, unpadded)
        return cls(**data)


FIELDS = tuple(f.name for f in fields(Heterogeneity))


def _check_padding(padding: Any, unpadded: list | None) -> None:
    """`concurrent_pauses` (the concurrent steps' padding) as `caramel.bench.contention.span_padding`
    records it, one list per rank of the unpadded compute (the factor takes the two together:
    `contention_inputs`); one check for a record read back (`from_dict`) and for the factor's use."""
    if unpadded is None:  # the spans less the sleeps against padded medians: no factor of either
        raise CaramelError("heterogeneity.concurrent_pauses needs heterogeneity.unpadded_compute_s (the factor "
                           "takes the two together), got the padding alone")
    if not isinstance(padding, list) or not all(isinstance(r, list) for r in padding):
        raise CaramelError(f"heterogeneity.concurrent_pauses must be a list per rank, got a {type(padding).__name__}")
    if len(padding) != len(unpadded):
        raise CaramelError(f"heterogeneity.concurrent_pauses lists {len(padding)} ranks, unpadded_compute_s "
                           f"{len(unpadded)}: expected one per rank in both")
    for rank, steps in enumerate(padding):
        for step, p in enumerate(steps):
            if not (isinstance(p, (list, tuple)) and len(p) == 3 and _is_num(p[0]) and _is_num(p[1])
                    and is_int(p[2]) and p[0] >= 0 and 0 <= p[1] <= p[0] and p[2] >= 0):
                raise CaramelError(f"heterogeneity.concurrent_pauses[{rank}][{step}]: expected [slept_s >= 0, "
                                   "0 <= slept_in_overlap_s <= slept_s, int collectives_started >= 0], "
                                   f"got {p!r}")


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_rank(rank: Any, world: int, key: str) -> int:
    if not is_int(rank) or not 0 <= rank < world:
        raise CaramelError(f"heterogeneity.{key}: rank must be an int in 0..{world - 1} (the configuration's "
                           f"{world} workers), got {rank!r}")
    return rank
