"""The `ddp` strategy in the simulator: DDP's buckets (fifo), reduced while backward runs, applied at step()."""
from __future__ import annotations

from caramel.profile.model_profile import ModelProfile
from caramel.sim.simulate import SimResult, simulate
from caramel.strategies.ddp.options import DdpOptions
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec


def simulate_ddp(profile: ModelProfile, cluster: ClusterSpec, options: DdpOptions, iterations: int = 4) -> SimResult:
    plan = make_plan("fifo", profile, cluster, bucket_cap_mb=options.bucket_cap_mb)
    return simulate(profile, cluster, plan, overlap="backward", iterations=iterations)
