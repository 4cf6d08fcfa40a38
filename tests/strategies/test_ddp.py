"""The `ddp` strategy is torch's DDP as users construct it: its buckets, in the runtime and the simulator."""
import pytest
import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.ddp.options import DdpOptions
from caramel.strategies.ddp.simulate import ddp_plan
from caramel.testing import run_workers
from caramel.topology.spec import ClusterSpec

MB = 1024 * 1024


def _bucket_caps(rank: int, world: int, strategy: str) -> dict:
    import caramel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    wrapped, _ = caramel.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy=strategy)
    plain = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))  # what a user's DDP(model) gets
    caps = lambda m: (m.bucket_bytes_cap, m.bucket_bytes_cap_default)  # noqa: E731
    return {"caramel": caps(wrapped), "torch": caps(plain)}


@pytest.mark.timeout(120)
def test_the_default_is_torchs_own_bucketing_and_a_cap_is_passed_on():
    default = run_workers(_bucket_caps, 1, args=("ddp",), timeout_s=90)[0]
    # bucket_bytes_cap_default: torch reduces a small first bucket early in backward
    assert default["caramel"] == default["torch"] == (25 * MB, True)
    capped = run_workers(_bucket_caps, 1, args=("ddp:bucket_cap_mb=5",), timeout_s=90)[0]
    assert capped["caramel"] == (5 * MB, False)


def test_the_simulated_buckets_are_the_ones_torch_builds():
    sizes = [MB // 2] * 12  # backward makes them ready last to first
    profile, cluster = synthetic_profile(sizes_bytes=sizes), ClusterSpec.uniform(2, 1e9)
    default = [b.bytes for b in ddp_plan(profile, cluster, DdpOptions()).buckets]
    assert default == [MB, 5 * MB]  # the 1 MB first bucket, then the rest under the 25 MB cap
    capped = [b.bytes for b in ddp_plan(profile, cluster, DdpOptions(bucket_cap_mb=2.0)).buckets]
    assert capped == [2 * MB, 2 * MB, 2 * MB]


@pytest.mark.parametrize("cap", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_cap_that_is_not_a_positive_number_is_an_error(cap):
    with pytest.raises(CaramelError, match="bucket_cap_mb must be a positive, finite number"):
        DdpOptions(bucket_cap_mb=cap)
