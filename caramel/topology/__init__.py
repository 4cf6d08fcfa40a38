"""The planner's view of the machines: `ClusterSpec` (workers, links, collective) and the
probe that fits one from real collectives."""
from caramel.topology.spec import ClusterSpec, WorkerSpec

__all__ = ["ClusterSpec", "WorkerSpec"]
