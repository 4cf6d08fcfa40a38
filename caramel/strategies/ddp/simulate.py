"""The `ddp` strategy in the simulator: DDP's buckets (fifo), reduced while backward runs, applied at step()."""
from __future__ import annotations

from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim.simulate import SimResult, simulate
from caramel.strategies.ddp.options import DdpOptions
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec


def ddp_plan(profile: ModelProfile, cluster: ClusterSpec, options: DdpOptions) -> Plan:
    """DDP's buckets for `options` (torch's small first bucket only under its default cap), in ready order."""
    first_mb, cap_mb = options.bucket_caps_mb()
    return make_plan("fifo", profile, cluster, bucket_cap_mb=cap_mb, first_bucket_mb=first_mb)


def simulate_ddp(profile: ModelProfile, cluster: ClusterSpec, options: DdpOptions, iterations: int = 4) -> SimResult:
    return simulate(profile, cluster, ddp_plan(profile, cluster, options), overlap="backward", iterations=iterations)
