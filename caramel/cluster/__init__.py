"""Emulated multi-node cluster on one Linux host (network namespaces, veth, bridge, tc), and `ClusterSpec`.

`ClusterSpec` (spec.py) is the data the planner and simulator use; `EmulatedCluster` builds a
real shaped network to run torchrun jobs on; `probe_cluster` fits a ClusterSpec from real
all-reduces on it.
"""
from caramel.cluster.spec import ClusterSpec, WorkerSpec

__all__ = ["ClusterSpec", "WorkerSpec", "ClusterConfig", "EmulatedCluster", "probe_cluster", "fit_alpha_beta"]


def __getattr__(name):
    # Lazy: planners and the simulator import caramel.cluster for ClusterSpec only.
    if name == "ClusterConfig":
        from caramel.cluster.config import ClusterConfig
        return ClusterConfig
    if name == "EmulatedCluster":
        from caramel.cluster.emulated import EmulatedCluster
        return EmulatedCluster
    if name in ("probe_cluster", "fit_alpha_beta"):
        from caramel.cluster import probe
        return getattr(probe, name)
    raise AttributeError(f"module 'caramel.cluster' has no attribute {name!r}")
