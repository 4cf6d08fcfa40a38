"""PipeDream's partitioner and HAP's shard ratios against brute force and closed forms."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.strategies.pipeline.options import PipelineOptions, parse_partition
from caramel.strategies.pipeline.planner import (LayerCost, balanced_boundaries, brute_force_balanced,
                                                 brute_force_partition, layer_costs_from_profile,
                                                 pipedream_partition)
from caramel.strategies.pipeline.shards import shard_ratios, shard_sizes
from caramel.topology.spec import ClusterSpec


def random_costs(rng: random.Random, n: int) -> list[LayerCost]:
    return [LayerCost(rng.uniform(1e-3, 1e-2), rng.uniform(2e-3, 2e-2), rng.randint(1, 10) * 100_000,
                      rng.choice([0, 10_000, 4_000_000, 40_000_000])) for _ in range(n)]


@pytest.mark.parametrize("seed", range(12))
def test_pipedream_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    costs = random_costs(rng, rng.randint(2, 6))
    cluster = ClusterSpec.uniform(rng.randint(2, 4), rng.choice([1e8, 1e9, 1e10]))
    dp, brute = pipedream_partition(costs, cluster), brute_force_partition(costs, cluster)
    assert dp.slowest_s == pytest.approx(brute.slowest_s, rel=1e-12)
    assert sum(dp.replicas) <= cluster.world_size
    assert len(dp.boundaries) == len(dp.replicas) - 1


def test_pipedream_picks_pipeline_for_big_fc_and_replicas_for_cheap_weights():
    # a conv-like front (little weight, much compute) and a huge fully-connected tail
    costs = [LayerCost(0.02, 0.04, 4_000_000, 10_000)] * 3 + [LayerCost(0.002, 0.004, 4_000, 400_000_000)]
    slow = pipedream_partition(costs, ClusterSpec.uniform(4, 1e9))
    assert slow.boundaries == [3] and slow.replicas[-1] == 1 and slow.replicas[0] == 3
    light = [LayerCost(0.02, 0.04, 4_000_000, 1_000)] * 4
    assert pipedream_partition(light, ClusterSpec.uniform(4, 1e10)).replicas == [4]  # pure data parallel


@pytest.mark.parametrize("seed", range(10))
def test_uneven_workers_balance_matches_brute_force(seed):
    rng = random.Random(100 + seed)
    costs = random_costs(rng, rng.randint(3, 8))
    speeds = [rng.choice([0.5, 1.0, 2.0]) for _ in range(rng.randint(2, min(4, len(costs))))]
    cluster = ClusterSpec.uniform(len(speeds), 1e10)
    assert balanced_boundaries(costs, speeds, cluster).slowest_s == pytest.approx(
        brute_force_balanced(costs, speeds, cluster).slowest_s, rel=1e-12)


def test_worker_slowed_2x_gets_half_the_layers():
    costs = [LayerCost(0.01, 0.02, 1000, 0)] * 9
    cluster = ClusterSpec.uniform(2, 1e10)
    assert balanced_boundaries(costs, [1.0, 1.0], cluster).boundaries in ([4], [5])
    plan = balanced_boundaries(costs, [0.5, 1.0], cluster)  # worker 0 runs 2x slower
    assert plan.boundaries == [3]
    assert plan.slowest_s == pytest.approx(6 * 0.03)


def test_shard_ratios_follow_speed_and_caps():
    assert shard_ratios([1.0, 0.5]) == pytest.approx([2 / 3, 1 / 3])
    assert shard_ratios([1.0, 1.0, 0.5, 0.5], comm_s=0.3) == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6])
    # worker 0 may hold at most 40% (memory): the rest is spread by speed over the others
    assert shard_ratios([2.0, 1.0, 1.0], caps=[0.4, 1, 1]) == pytest.approx([0.4, 0.3, 0.3])
    assert shard_sizes(32, shard_ratios([1.0, 0.5])) in ([21, 11], [22, 10])
    assert sum(shard_sizes(7, [0.2, 0.3, 0.5])) == 7
    with pytest.raises(CaramelError, match="speeds must be positive"):
        shard_ratios([1.0, 0.0])
    with pytest.raises(CaramelError, match="caps"):
        shard_ratios([1.0, 1.0], caps=[0.2, 0.2])


def test_layer_costs_from_profile():
    from caramel.profile.profiler import profile_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    prof = profile_model(model, x, y, nn.functional.cross_entropy, steps=1)
    costs = layer_costs_from_profile(prof, model, x[:4])
    assert [c.output_bytes for c in costs] == [4 * 64 * 4, 4 * 64 * 4, 4 * 4 * 4]
    assert [c.param_bytes for c in costs] == [(8 * 64 + 64) * 4, 0, (64 * 4 + 4) * 4]
    assert costs[0].compute_s > 0 and costs[1].compute_s == 0


def test_options_errors_name_the_input():
    assert parse_partition("2+5", 3) == [2, 5] and parse_partition("auto", 3) is None
    with pytest.raises(CaramelError, match="gives 2 stages; stages=3"):
        PipelineOptions(stages=3, partition="4")
    with pytest.raises(CaramelError, match="increasing"):
        PipelineOptions(stages=3, partition="5+2")
    with pytest.raises(CaramelError, match="microbatches >= stages"):
        PipelineOptions(stages=4, microbatches=2)
    with pytest.raises(CaramelError, match="vertical_sync"):
        PipelineOptions(vertical_sync=True)
    with pytest.raises(CaramelError, match="all layer indices .* or all module names"):
        PipelineOptions(stages=3, partition="2+layers.4")
    assert PipelineOptions(partition="layers.2").boundaries() == ["layers.2"]


def test_equally_slow_cuts_prefer_the_smaller_activation():
    # one layer dominates: every cut before it is equally slow; the one after the layer that
    # shrinks the activation 4x sends the fewest bytes (big_fc: cut before the FC, not after conv2)
    costs = [LayerCost(0.003, 0.006, 32_000, 0), LayerCost(0.0, 0.0, 32_000, 0), LayerCost(0.0, 0.0, 8_000, 0),
             LayerCost(0.03, 0.09, 40, 0)]
    plan = balanced_boundaries(costs, [1.0, 1.0], ClusterSpec.uniform(2, 1e9))
    assert plan.boundaries == [3] and plan.slowest_s == pytest.approx(0.12)
    assert plan.slowest_s == brute_force_balanced(costs, [1.0, 1.0], ClusterSpec.uniform(2, 1e9)).slowest_s
