"""What the gossip simulator reads from the cluster about its links and workers, beyond the
spec's rate and latency: each worker's link rate, one worker's compute jitter, and the share of
a link's rate that concurrent peer flows achieve.

Jitter. `compute_jitter` {"rank", "fraction", "seed"} scales worker rank's compute per step by a
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

import random

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
    if not isinstance(raw, dict):
        raise CaramelError(f"cluster meta.compute_jitter must be a dict with keys {', '.join(keys)}, got {raw!r}")
    unknown = sorted(set(raw) - set(keys), key=str)
    if unknown:
        raise CaramelError(f"cluster meta.compute_jitter: unknown key(s) {', '.join(map(repr, unknown))}; "
                           f"expected {', '.join(keys)}")
    if "rank" not in raw or "fraction" not in raw:
        raise CaramelError(f"cluster meta.compute_jitter needs 'rank' and 'fraction', got {raw!r}")
    rank, frac, seed = raw["rank"], raw["fraction"], raw.get("seed", 0)
    pause = raw.get("pause_after_forward", False)
    if not _is_int(rank) or not 0 <= rank < n:
        raise CaramelError(f"cluster meta.compute_jitter.rank must be an int in 0..{n - 1}, got {rank!r}")
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
        raise CaramelError(f"cluster meta.compute_jitter.fraction must be a number in [0, 1), got {frac!r}")
    if not _is_int(seed):
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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
