"""Which heterogeneity inputs each strategy's simulator reads, so that a prediction made on a
cluster carrying an input its simulator ignores can say so rather than be ranked as if it did.

A cluster is uneven in three ways (docs/benchmarks.md, heterogeneous configurations): a slow
worker (each worker's `speed`, which every simulator reads), a slow link (meta
`worker_bandwidth_bps`) and a jitter (meta `compute_jitter`). The gossip, ddp and caramel
simulators read all three (ddp and caramel the link as one bottleneck rate, the jitter through
`caramel.sim.jitter`); ps and pipeline read only the speeds.
"""
from __future__ import annotations

from caramel.topology.spec import ClusterSpec

INPUTS = ("slow_link", "jitter", "slow_worker")
READS: dict[str, tuple[str, ...]] = {
    "gossip": ("slow_link", "jitter", "slow_worker"),  # worker_bandwidth_bps, compute_jitter, speeds
    # one rate: the ring's bottleneck, as the comm-only baseline measured it; the jitter's pauses (`caramel.sim.jitter`)
    "ddp": ("slow_link", "jitter", "slow_worker"),
    "caramel": ("slow_link", "jitter", "slow_worker"),
}
"""per strategy kind, the heterogeneity its simulator takes (the rest it ignores)"""
DEFAULT_READS = ("slow_worker",)  # every simulator reads the workers' speeds
META_INPUTS = {"worker_bandwidth_bps": "slow_link", "compute_jitter": "jitter"}
"""the cluster meta key that carries each input a simulator may ignore"""


def strategy_kind(name: str) -> str:
    """A spec's strategy name (`"ps:order=tac"` -> `"ps"`)."""
    return name.partition(":")[0]


def reads(name: str) -> tuple[str, ...]:
    """The inputs strategy `name`'s simulator takes."""
    return READS.get(strategy_kind(name), DEFAULT_READS)


def cluster_inputs(cluster: ClusterSpec) -> list[str]:
    """The inputs a simulator may ignore that `cluster`'s meta carries, in `INPUTS` order."""
    present = {v for k, v in META_INPUTS.items() if cluster.meta.get(k) is not None}
    return [k for k in INPUTS if k in present]


def ignored_by(name: str, present: list[str]) -> list[str]:
    """The inputs of `present` that strategy `name`'s simulator does not take."""
    taken = reads(name)
    return [k for k in present if k not in taken]
