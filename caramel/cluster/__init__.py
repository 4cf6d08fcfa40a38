"""Emulated multi-node cluster on one Linux host (network namespaces, veth, bridge, tc).

`EmulatedCluster` builds a real shaped network to run torchrun jobs on; `probe_cluster` (in
`caramel.topology.probe`) fits a `ClusterSpec` from real all-reduces on it.
"""
__all__ = ["ClusterConfig", "EmulatedCluster"]


def __getattr__(name):
    # lazy: `caramel cluster --help` and the spec readers need no torch
    if name == "ClusterConfig":
        from caramel.cluster.config import ClusterConfig
        return ClusterConfig
    if name == "EmulatedCluster":
        from caramel.cluster.emulated import EmulatedCluster
        return EmulatedCluster
    raise AttributeError(f"module 'caramel.cluster' has no attribute {name!r}")
