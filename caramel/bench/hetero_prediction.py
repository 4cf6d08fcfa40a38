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
- jitter: meta `compute_jitter` with the same rank, fraction and seed and
  `pause_after_forward: true` (the bench's emulation: a sleep after the forward), for the
  simulators that read it (gossip). Their workers' speeds come from the unpadded compute: each
  rank's compute-only median less the median pause, (nominal - 1) x the calibrated compute per
  sample x the local batch (the draws' median is 1). The other simulators get the padded
  medians (the mean padding is in them, the per-step variance is not) and are marked as
  ignoring the jitter.

A prediction that ignores an input carries `ignores` (the record's `prediction_ignores`), and
the report marks its row instead of counting it toward the simulator's accuracy.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from caramel.bench.hetero import link_rates_bps, nominal_factor

INPUTS = ("slow_link", "jitter", "slow_worker")
READS: dict[str, tuple[str, ...]] = {
    "gossip": ("slow_link", "jitter", "slow_worker"),  # worker_bandwidth_bps, compute_jitter, speeds
    "ddp": ("slow_link", "slow_worker"),  # one rate: the ring's bottleneck, as the comm-only baseline measured it
    "caramel": ("slow_link", "slow_worker"),
}
DEFAULT_READS = ("slow_worker",)  # every simulator reads the workers' speeds
"""per strategy kind, the heterogeneity its simulator takes (the rest it ignores)"""


def strategy_kind(name: str) -> str:
    return name.partition(":")[0]


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

    def present(self) -> list[str]:
        return [k for k in INPUTS if getattr(self, k)]

    def ignored_by(self, name: str) -> list[str]:
        """The inputs present that strategy `name`'s simulator does not take."""
        reads = READS.get(strategy_kind(name), DEFAULT_READS)
        return [k for k in self.present() if k not in reads]

    def reads_jitter(self, name: str) -> bool:
        return bool(self.jitter) and "jitter" in READS.get(strategy_kind(name), DEFAULT_READS)

    def worker_bandwidth_bps(self, world: int, bottleneck_bps: float) -> list[float] | None:
        """Each worker's rate (module docstring), the slowest at `bottleneck_bps`; None without a slow link."""
        if not self.slow_link:
            return None
        shaped = link_rates_bps(1.0, world, self.slow_link)
        return [bottleneck_bps * r / min(shaped) for r in shaped]

    def pause_s(self) -> float:
        """A worker's median pause after the forward per step: (nominal - 1) x its calibrated compute."""
        j = self.jitter
        if not j:
            return 0.0
        if not self.local_batch:
            raise ValueError("the jitter's pause needs the local batch")
        return (nominal_factor(j["fraction"]) - 1.0) * j["compute_per_sample_s"] * self.local_batch

    def unpadded_compute_s(self, rank_compute_s: list[float]) -> list[float]:
        """Each rank's compute-only median without the jitter's padding (floored at a tenth of it)."""
        pause = self.pause_s()
        return [max(c - pause, 0.1 * c) for c in rank_compute_s]

    def compute_jitter(self) -> dict[str, Any] | None:
        """The gossip simulator's meta `compute_jitter` for the bench's emulation."""
        j = self.jitter
        if not j:
            return None
        return {"rank": int(j["rank"]), "fraction": float(j["fraction"]), "seed": int(j["seed"]),
                "pause_after_forward": True}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Heterogeneity":
        return cls(**(data or {}))
