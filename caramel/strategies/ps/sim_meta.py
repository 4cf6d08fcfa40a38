"""The ps simulator's readers of the cluster spec's meta: what the bench measured about the
links and the runtime (`caramel.bench.prediction`, `caramel.bench.traffic_probe`), each
checked, with one clear error naming the key and what it expects."""
from __future__ import annotations

from typing import Callable

from caramel.errors import CaramelError
from caramel.strategies.ps.sim_flows import check_curve
from caramel.strategies.ps.sim_pulls import check_pull_curve
from caramel.topology.spec import ClusterSpec


def workers_per_node(cluster: ClusterSpec) -> int:
    """hierarchical=True: the cluster spec's `meta["workers_per_node"]` (consecutive workers)."""
    raw = cluster.meta.get("workers_per_node")
    if raw is None:
        raise CaramelError("ps: simulating hierarchical=true needs the cluster spec's meta.workers_per_node "
                           "(how many consecutive workers share a node)")
    if not isinstance(raw, int) or raw < 1 or cluster.world_size % raw:
        raise CaramelError(f"ps: meta.workers_per_node must divide the {cluster.world_size} workers, got {raw!r}")
    return raw


BACKENDS = ("gloo", "nccl")


def backend(cluster: ClusterSpec) -> str:
    """The process-group backend the run uses: the cluster spec's `meta["backend"]`, else the
    backend its probe measured (`meta["probe"]["backend"]`), else gloo. It decides how a
    hierarchical leader's node sums travel (`NodeSums.sends_point_to_point`)."""
    probe = cluster.meta.get("probe")
    key = "backend" if "backend" in cluster.meta else "probe.backend"
    raw = cluster.meta.get("backend", probe.get("backend") if isinstance(probe, dict) else None)
    if raw is None:
        return "gloo"
    if raw not in BACKENDS:
        raise CaramelError(f"ps: meta.{key} must be one of {', '.join(BACKENDS)} (the process-group backend "
                           f"the run uses), got {raw!r}")
    return raw


def link_queue_s(cluster: ClusterSpec) -> float:
    """The most a small message waits behind one bulk transfer (`queues.py`): the cluster spec's
    `meta["link_queue_s"]` (the bench measures it, `caramel.bench.traffic_probe`); 0, no queues
    modelled, when not given."""
    raw = cluster.meta.get("link_queue_s")
    if raw is None:
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw >= 0:
        raise CaramelError(f"ps: meta.link_queue_s must be a number of seconds >= 0 (the most a small message waits "
                           f"behind one bulk transfer on a link), got {raw!r}")
    return float(raw)


def efficiency(cluster: ClusterSpec, key: str) -> float:
    """The share of the link rate the colocated servers' pushes (`push_efficiency`: every worker
    sending to every other at once) or pulls (`pull_efficiency`: every server broadcasting at
    once) achieve: the cluster spec's meta (the bench measures both, `caramel.bench.traffic_probe`),
    1 when not given."""
    raw = cluster.meta.get(key)
    if raw is None:
        return 1.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= 1:
        raise CaramelError(f"ps: meta.{key} must be a number in (0, 1] (the share of the link rate the servers' "
                           f"{key.split('_')[0]}es achieve), got {raw!r}")
    return float(raw)


def push_curve_of(cluster: ClusterSpec) -> list[float] | None:
    """`meta["push_efficiency_by_count"]` (the bench's probe from version 2 on): the share of the
    rate each server's NIC receives at while 1..n pushes run at once (`sim_flows.py`); None when
    not given, and the pushes keep the all-at-once `push_efficiency`."""
    return _curve_of(cluster, "push_efficiency_by_count", check_curve)


def pull_curve_of(cluster: ClusterSpec) -> list[float] | None:
    """`meta["pull_efficiency_by_count"]` (the bench's probe from version 4 on): the share of the
    rate each server's pull goes at while 1..n pulls run at once (`sim_pulls.py`); None when not
    given, and the pulls keep the all-at-once `pull_efficiency`."""
    return _curve_of(cluster, "pull_efficiency_by_count", check_pull_curve)


def _curve_of(cluster: ClusterSpec, key: str, check: Callable[[object, int], list[float]]) -> list[float] | None:
    """`meta[key]` checked by `check` against the world (its ValueError as the one CaramelError)."""
    raw = cluster.meta.get(key)
    if raw is None:
        return None
    try:
        return check(raw, cluster.world_size)
    except ValueError as e:
        raise CaramelError(str(e)) from None


def receives_early_of(cluster: ClusterSpec) -> bool:
    """`meta["push_receives_early"]`: the run's runtime posts a flat colocated server's push
    receives at the step's first gradient (gloo, from 52caff3 on; the bench writes it). False
    when not given: the receive is posted at the server's own push of the bucket, as in every
    record written before the field."""
    raw = cluster.meta.get("push_receives_early", False)
    if not isinstance(raw, bool):
        raise CaramelError(f"ps: meta.push_receives_early must be true or false (whether the runtime posts a "
                           f"colocated server's push receives at the step's first gradient), got {raw!r}")
    return raw
