"""replicas="auto": the synchronous replica partitioner against brute force, what it picks, the options."""
from __future__ import annotations

import random

import pytest

from caramel.errors import CaramelError
from caramel.strategies.options import build_options
from caramel.strategies.pipeline.auto_replicas import (brute_force_replica_partition, choose_replicas, feasible,
                                                       replica_partition)
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.planner import LayerCost, ScalingCost
from caramel.topology.spec import ClusterSpec, WorkerSpec


def random_costs(rng: random.Random, n: int) -> list[LayerCost]:
    return [LayerCost(rng.uniform(1e-3, 1e-2), rng.uniform(2e-3, 2e-2), rng.randint(1, 10) * 100_000,
                      rng.choice([0, 10_000, 4_000_000, 40_000_000])) for _ in range(n)]


@pytest.mark.parametrize("seed", range(16))
def test_dp_matches_brute_force(seed):
    rng = random.Random(300 + seed)
    costs = random_costs(rng, rng.randint(2, 6))
    world = rng.randint(2, 5)
    speeds = [rng.choice([0.5, 1.0, 2.0]) for _ in range(world)]
    cluster = ClusterSpec(workers=[WorkerSpec(f"w{i}", speed=s) for i, s in enumerate(speeds)],
                          bandwidth_bps=rng.choice([1e8, 1e9, 1e10]))
    stages = rng.randint(2, min(world, len(costs)))
    m = rng.choice([1, 2, 3, 4, 6, 8])
    schedule = rng.choice(["gpipe", "1f1b"])
    dp = replica_partition(costs, cluster, stages, m, schedule)
    brute = brute_force_replica_partition(costs, cluster, stages, m, schedule)
    assert (dp is None) == (brute is None)
    if dp is not None:
        assert dp.slowest_s == pytest.approx(brute.slowest_s, rel=1e-12)
        assert sum(dp.replicas) == world and len(dp.replicas) == stages == len(dp.boundaries) + 1
        assert feasible(dp.replicas, m, schedule)


# a front that computes much and holds little weight, a tail that computes little and holds much
FRONT = [LayerCost(0.02, 0.04, 400_000, 40_000)] * 2
TAIL = [LayerCost(0.01, 0.02, 4_000, 40_000_000)]


def test_compute_heavy_light_stage_gets_the_replicas():
    cluster = ClusterSpec.uniform(3, 1e9)
    plan = replica_partition(FRONT + TAIL, cluster, 2, 4)
    assert plan.boundaries == [2] and plan.replicas == [2, 1]
    assert plan.slowest_s == pytest.approx(brute_force_replica_partition(FRONT + TAIL, cluster, 2, 4).slowest_s)
    # mirrored (the heavy, light part last): the replicas follow it
    mirrored = replica_partition(TAIL + FRONT, cluster, 2, 4)
    assert mirrored.boundaries == [1] and mirrored.replicas == [1, 2]


def test_expensive_allreduce_means_fewer_replicas():
    # two layers, so one cut: a heavy one with 8 MB of weights, a light one with none
    layers = [LayerCost(0.02, 0.04, 400_000, 8_000_000), LayerCost(0.005, 0.005, 4_000, 0)]
    fast, slow = ClusterSpec.uniform(4, 1e10), ClusterSpec.uniform(4, 1e8)
    assert replica_partition(layers, fast, 2, 12).replicas == [3, 1]  # the all-reduce costs 8.5 ms
    assert replica_partition(layers, slow, 2, 12).replicas == [1, 3]  # 0.85 s: no replica is worth it
    for cluster in (fast, slow):
        assert replica_partition(layers, cluster, 2, 12).slowest_s == pytest.approx(
            brute_force_replica_partition(layers, cluster, 2, 12).slowest_s)


def test_only_counts_the_runtime_runs():
    # 3 workers, 2 stages: 2+1 and 1+2 need an even microbatch count, 1f1b two per virtual pipeline
    assert replica_partition(FRONT + TAIL, ClusterSpec.uniform(3, 1e9), 2, 3) is None
    assert replica_partition(FRONT + TAIL, ClusterSpec.uniform(3, 1e9), 2, 2, "1f1b") is None
    assert replica_partition(FRONT + TAIL, ClusterSpec.uniform(3, 1e9), 2, 4, "1f1b").replicas == [2, 1]
    layers = [ScalingCost(0.0, c.forward_s / 8, 0.0, c.backward_s / 8, c.output_bytes / 8, c.param_bytes)
              for c in FRONT + TAIL]
    with pytest.raises(CaramelError, match="microbatches=3"):
        choose_replicas(layers, 24, "gpipe", ClusterSpec.uniform(3, 1e9), stages=2, microbatches=3)


def test_choice_over_stages_and_microbatches_is_the_simulated_fastest():
    layers = [ScalingCost(1e-3, c.forward_s / 8, 1e-3, c.backward_s / 8, c.output_bytes / 8, c.param_bytes)
              for c in FRONT + TAIL]
    cluster = ClusterSpec.uniform(3, 1e9)
    free = choose_replicas(layers, 24, "gpipe", cluster)
    assert free.predicted_step_s == min(free.candidates_s.values())
    assert f"{free.stages}x{free.microbatches}" in free.candidates_s
    assert any(k.startswith("3x") for k in free.candidates_s)  # stages chosen too
    two = choose_replicas(layers, 24, "gpipe", cluster, stages=2, microbatches=4)
    assert (two.stages, two.microbatches, two.counts) == (2, 4, [2, 1]) and list(two.candidates_s) == ["2x4"]


def test_options():
    o = build_options(PipelineOptions, {"replicas": "auto", "stages": "auto"}, where="pipeline")
    assert o.auto_replicas and o.boundaries() is None
    with pytest.raises(CaramelError, match="counts are chosen"):
        o.replica_counts()
    for bad, match in (({"replicas": "auto", "schedule": "pipedream"}, "gpipe or 1f1b"),
                       ({"replicas": "auto", "schedule": "interleaved"}, "gpipe or 1f1b"),
                       ({"replicas": "auto", "partition": "3"}, "partition=auto"),
                       ({"replicas": "auto", "replica_reduce": "ddp"}, "replica_reduce=auto"),
                       ({"replicas": "auto", "stages": 1}, "stages must be"),
                       ({"stages": "auto"}, "replicas=auto too")):
        with pytest.raises(CaramelError, match=match):
            PipelineOptions(**bad)


def test_simulator_takes_the_runtime_choice():
    """`caramel simulate --strategy pipeline:replicas=auto` resolves the counts with the same
    chooser on the profile's layers and records them."""
    import torch
    import torch.nn as nn

    from caramel.profile.profiler import profile_model
    from caramel.strategies import STRATEGIES
    from caramel.strategies.pipeline.profile_costs import scaling_from_profile

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    prof = profile_model(model, x, y, nn.functional.cross_entropy, steps=2, small_batch_size=2)
    cluster = ClusterSpec.uniform(3, 1e8)
    spec = STRATEGIES.spec("pipeline:replicas=auto,microbatches=4")
    result = spec.simulate(prof, cluster, 2)
    _, layers = scaling_from_profile(prof)
    choice = choose_replicas(layers, 8 * 3, "1f1b", cluster, stages=2, microbatches=4,
                             optimizer_s=prof.optimizer_time_s)
    assert result.meta["replicas_auto"]["counts"] == choice.counts
    assert result.step_time_s == pytest.approx(choice.predicted_step_s)


def test_equal_counts_past_the_virtual_pipeline_limit():
    # 64 workers in 2 stages of 32 replicas: a hybrid of 32 pipelines, not 32 virtual ones
    layers = [ScalingCost(0.0, c.forward_s / 8, 0.0, c.backward_s / 8, c.output_bytes / 8, c.param_bytes)
              for c in FRONT + TAIL]
    assert feasible((32, 32), 32, "gpipe") and not feasible((32, 16, 16), 32, "gpipe")
    choice = choose_replicas(layers, 64, "gpipe", ClusterSpec.uniform(64, 1e9), stages=2, microbatches=32)
    assert choice.counts == [32, 32]


def test_impossible_stage_counts_say_why():
    layers = [ScalingCost(0.0, c.forward_s / 8, 0.0, c.backward_s / 8, c.output_bytes / 8, c.param_bytes)
              for c in FRONT + TAIL]
    with pytest.raises(CaramelError, match="needs 2 or more workers; the group has 1"):
        choose_replicas(layers, 24, "gpipe", ClusterSpec.uniform(1, 1e9))
    with pytest.raises(CaramelError, match="stages=4 needs 4 workers.*the group has 3 workers"):
        choose_replicas(layers, 24, "gpipe", ClusterSpec.uniform(3, 1e9), stages=4)
    with pytest.raises(CaramelError, match=f"the model {len(layers)} layers"):
        choose_replicas(layers, 24, "gpipe", ClusterSpec.uniform(64, 1e9), stages=len(layers) + 1)


def test_a_weight_tied_across_layers_gets_equal_counts_only():
    from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo
    from caramel.strategies.pipeline.profile_costs import shares_a_weight

    # a heavy layer with 8 MB of weights, a light one: 3+1 untied
    layers = [ScalingCost(0.0, c.forward_s / 8, 0.0, c.backward_s / 8, c.output_bytes / 8, c.param_bytes)
              for c in [LayerCost(0.02, 0.04, 400_000, 8_000_000), LayerCost(0.005, 0.005, 4_000, 0)]]
    cluster = ClusterSpec.uniform(4, 1e9)
    assert choose_replicas(layers, 24, "gpipe", cluster, stages=2, microbatches=12).counts == [3, 1]
    tied = choose_replicas(layers, 24, "gpipe", cluster, stages=2, microbatches=12, equal_counts=True)
    assert tied.counts == [2, 2]
    free = choose_replicas(layers, 24, "gpipe", cluster, equal_counts=True)
    assert len(set(free.counts)) == 1
    with pytest.raises(CaramelError, match="tied across layers takes equal counts"):
        choose_replicas(layers, 24, "gpipe", ClusterSpec.uniform(3, 1e9), stages=2, equal_counts=True)

    def profile(uses):
        mods = [ModuleInfo(name=n, type="Linear", forward_start_s=0.0, forward_time_s=1.0, backward_time_s=1.0)
                for n in ("a", "b")]
        return ModelProfile(model="m", batch_size=4, forward_time_s=2.0, backward_time_s=2.0, optimizer_time_s=0.0,
                            params=[ParamInfo(index=0, name="a.weight", shape=[2, 2], dtype="float32", numel=4, bytes=16, requires_grad=True,
                                              use_modules=uses)], modules=mods)
    assert shares_a_weight(profile(["a", "b"])) and not shares_a_weight(profile(["a"]))
