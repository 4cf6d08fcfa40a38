"""What the gossip simulator reads from the cluster about its links and workers, beyond the
spec's rate and latency: each worker's link rate, one worker's compute jitter, and the share of
a link's rate that concurrent peer flows achieve.

Jitter (read by `caramel.sim.jitter`, shared with the all-reduce model). `compute_jitter` {"rank", "fraction", "seed"} scales worker rank's compute per step by a
uniform draw from [1 - f, 1 + f] (seeded). With `"pause_after_forward": true` it describes the
bench's emulation instead (`caramel.bench.hetero`): compute cannot be made faster, so every
worker runs its compute as profiled and sleeps after its forward for (nominal x draw - 1) x its
forward + backward, nominal = 1 / (1 - f), draw 1 for the workers not jittered; with
`"pause_unit_s"` (seconds) the pause is (nominal x draw - 1) x that instead, as the bench sleeps
it (its calibrated compute per step, which need not equal the profile's at the worker's speed). A sleep is not
compute: it does not slow beside transfers, and the exchange cannot hide behind the modules'
forward for longer than their real compute.

Flows. The bench's comm-only baseline, whose rate the predictions take, is a ring all-reduce:
one flow into and one out of each link. A gossip worker sends to d peers and receives from d
at once, one gloo connection (and send/receive thread) per peer and direction; on a shared
host's cores and through one shaped link d flows carry less than d times 1/d of the rate. The
traffic probe measures it at d = n - 1 (`caramel.bench.traffic_probe`: every rank sends a shard
to every other at once; `push_efficiency` in the cluster meta, as the ps model reads it). At
d = 1 the share is 1 by definition of the rate; between the two it is interpolated linearly
in the number of extra flows (an assumption: the probe measures only the end point). The
probe's messages are a shard (the gradient bytes / n), a gossip message the model: the share
is taken as independent of the size. Without the probe's measurement: 1 (no evidence). The
bench passes it to every prediction's cluster (`caramel.bench.prediction.bench_cluster`).
"""
from __future__ import annotations

from caramel.errors import CaramelError
from caramel.topology.spec import ClusterSpec


def link_rate_Bps(cluster: ClusterSpec) -> list[float]:
    """Each worker's link rate in bytes/s: meta `worker_bandwidth_bps` (bit/s) or the cluster's."""
    raw = cluster.meta.get("worker_bandwidth_bps")
    if raw is None:
        return [cluster.bandwidth_bps / 8] * cluster.world_size
    if (not isinstance(raw, list) or len(raw) != cluster.world_size
            or any(isinstance(r, bool) or not (isinstance(r, (int, float)) and r > 0) for r in raw)):
        raise CaramelError(f"cluster meta.worker_bandwidth_bps must list {cluster.world_size} positive rates in "
                           f"bit/s, got {raw!r}")
    return [r / 8 for r in raw]


def flow_share(cluster: ClusterSpec, flows: int) -> float:
    """The share of a link's rate that `flows` concurrent peer flows achieve together (module
    docstring): 1 for one flow, meta `push_efficiency` for n - 1, linear between."""
    n = cluster.world_size
    raw = cluster.meta.get("push_efficiency")
    if raw is None:
        return 1.0
    # checked whatever the flows, as the ps model checks it (`caramel.strategies.ps.simulate`)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= 1:
        raise CaramelError(f"cluster meta.push_efficiency must be a number in (0, 1] (the share of the link rate "
                           f"n - 1 concurrent flows achieve), got {raw!r}")
    if flows <= 1 or n <= 2:
        return 1.0
    extra = min(flows, n - 1) - 1
    return 1.0 - (1.0 - raw) * extra / (n - 2)
