"""Bucket fusion in the ps strategy: how buckets form, the option, the simulator, and that fused
and unfused runs train the same parameters (2 gloo workers)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import resnet50_profile, synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps.buckets import cap_bytes, make_buckets
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.planner import PsPlan, make_ps_plan
from caramel.testing import run_workers
from caramel.topology.spec import ClusterSpec
from tests.strategies.ps.ps_workers import fusion_worker


def test_buckets_keep_to_one_shard_and_kind_in_push_order_within_the_cap():
    rng = random.Random(0)
    for trial in range(200):
        n = rng.randint(1, 40)
        push = rng.sample(range(n), n)
        owner = {i: rng.randrange(3) for i in range(n)}
        sizes = {i: rng.choice([4, 64, 4096, 100_000]) for i in range(n)}
        kinds = {i: rng.choice(["torch.float32@cpu", "torch.float16@cpu"]) for i in range(n)}
        cap = rng.choice([0, 1000, 10_000, 1 << 20])
        buckets = make_buckets(push, owner, sizes, kinds, cap)
        assert sorted(i for b in buckets for i in b) == list(range(n))
        pos = {i: k for k, i in enumerate(push)}
        for b in buckets:
            assert len({owner[i] for i in b}) == 1 and len({kinds[i] for i in b}) == 1, (trial, b)
            assert [pos[i] for i in b] == sorted(pos[i] for i in b)  # members in push order
            assert len(b) == 1 or sum(sizes[i] for i in b) <= cap
        assert [pos[b[-1]] for b in buckets] == sorted(pos[b[-1]] for b in buckets)  # pushed as they complete
        if cap == 0:
            assert buckets == [[i] for i in push]


def test_a_plan_whose_bucket_mixes_servers_is_refused():
    with pytest.raises(CaramelError, match="mixes server shards"):
        PsPlan([0, 1], {0: 0, 1: 1}, [1, 0], [0, 1], order="tac", shards=2, buckets=[[1, 0]], bucket_pull=[0])
    with pytest.raises(CaramelError, match="every trainable parameter exactly once"):
        PsPlan([0, 1], {0: 0, 1: 0}, [1, 0], [0, 1], order="tac", shards=2, buckets=[[1]], bucket_pull=[0])


def test_fused_plan_on_resnet50_orders_buckets():
    prof = resnet50_profile()
    fused = make_ps_plan(prof, PsOptions(), shards=4, bandwidth_Bps=1.25e8)
    unfused = make_ps_plan(prof, PsOptions(bucket_cap_mb=0), shards=4, bandwidth_Bps=1.25e8)
    assert len(unfused.buckets) == len(unfused.params) == 161
    assert 4 <= len(fused.buckets) < 161 // 2  # a bucket holds the small tensors beside a big one
    assert fused.predicted["buckets"] == len(fused.buckets)
    for b in fused.buckets:
        assert len({fused.owner[i] for i in b}) == 1
    # the pull order is the pull buckets in TAC order, each bucket's parameters together
    assert fused.pull_order == [i for b in fused.bucket_pull for i in fused.pull_buckets[b]]
    assert fused.owner == unfused.owner  # placement does not depend on fusion
    assert PsPlan.from_dict(fused.to_dict()) == fused


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc", "true"])
def test_a_bad_bucket_cap_is_one_error_naming_the_option(value):
    with pytest.raises(CaramelError, match="bucket_cap_mb") as e:
        STRATEGIES.spec(f"ps:bucket_cap_mb={value}").simulate(resnet50_profile(), ClusterSpec.uniform(2, 1e9))
    assert "\n" not in str(e.value)


def test_the_simulator_schedules_buckets():
    """Many small tensors on a fast link: per-tensor latency dominates; fused, one latency per bucket."""
    prof = synthetic_profile(sizes_bytes=[20_000] * 60, forward_time_s=0.02, backward_time_s=0.04,
                             optimizer_time_s=0.002)
    cluster = ClusterSpec.uniform(4, 10e9)
    cluster.latency_s = 1e-3
    fused = STRATEGIES.spec("ps").simulate(prof, cluster)
    unfused = STRATEGIES.spec("ps:bucket_cap_mb=0").simulate(prof, cluster)
    assert unfused.num_items == 60 and fused.num_items == fused.meta["buckets"] == 4  # one per server
    assert fused.comm_time_s == pytest.approx(unfused.comm_time_s - 2 * (60 - 4) * cluster.latency_s)
    assert fused.step_time_s < unfused.step_time_s
    assert cap_bytes(1.5) == 1.5 * 2 ** 20 and cap_bytes(0) == 0


SPECS = ("ps:bucket_cap_mb=0", "ps", "ps:bucket_cap_mb=0.002")  # unfused, default, buckets of <= 2 KiB
CASES = tuple((f, o, s) for f, o in (("cnn_bn", "sgd_momentum"), ("gpt_tied", "adam")) for s in SPECS)


def test_fused_and_unfused_train_identical_parameters():
    """6 steps (the online profile's re-plan included) under each bucket cap: bit-identical
    parameters on both ranks, every bucket on one server, the wire order the plan's."""
    results = run_workers(fusion_worker, 2, args=(6, CASES), timeout_s=180)
    for res in results:
        for family, opt_kind, _ in CASES:
            ref = res[(family, opt_kind, SPECS[0])]
            assert all(len(b) == 1 for b in ref["buckets"])  # one tensor each
            assert len(ref["buckets"]) == len(ref["trainable"])
            for spec in SPECS[1:]:
                r = res[(family, opt_kind, spec)]
                assert all(np.array_equal(a, b) for a, b in zip(ref["params"], r["params"])), (family, spec)
                assert r["stats_buckets"] == len(r["buckets"]) < len(r["trainable"])
                for b in r["buckets"]:
                    assert len({r["owner"][i] for i in b}) == 1, (family, spec, b)
                assert [o for _, o in r["sent"]] == r["expected"] and len(r["sent"]) >= 3
            small, default = res[(family, opt_kind, SPECS[2])], res[(family, opt_kind, SPECS[1])]
            assert len(small["buckets"]) > len(default["buckets"])
    for key in (k for k in results[0] if k[0] == "gpt_tied"):  # cnn_bn's BatchNorm statistics stay per rank, as DDP's
        assert all(np.array_equal(a, b) for a, b in zip(results[0][key]["params"], results[1][key]["params"]))
