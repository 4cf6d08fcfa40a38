"""The simulator and the `replicas="auto"` chooser on tied and frozen weights, bad reduction
modes, and a choice that the overlapped reduction changes."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.auto_replicas import choose_replicas
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.overlap import stage_buckets
from caramel.strategies.pipeline.planner import LayerCost, ScalingCost
from caramel.strategies.pipeline.profile_costs import (TiedWeight, scaling_from_profile, tied_allreduce_s,
                                                       tied_weights, with_held_bytes)
from caramel.strategies.pipeline.simulate import simulate_pipeline, stage_costs
from caramel.topology.spec import ClusterSpec

CLUSTER = ClusterSpec.uniform(4, 1e7)
OPTS = PipelineOptions(stages=2, replicas=2, schedule="1f1b", microbatches=2, partition="layer2")


def _profile(tie: tuple[str, ...] = (), frozen: tuple[int, ...] = (), owner: int = 0):
    """Four layers, the first holding 400 kB; `tie`: the layers using layer `owner`'s weight."""
    prof = synthetic_profile(sizes_bytes=[400_000, 4096, 4096, 4096], times_s=[1, 1, 1, 1])
    params = [dataclasses.replace(p, use_modules=list(tie) if p.index == owner and tie else p.use_modules,
                                  requires_grad=p.index not in frozen) for p in prof.params]
    return dataclasses.replace(prof, params=params)


def test_a_split_tied_weight_is_reduced_by_every_holder_and_summed_with_ddp():
    prof = _profile(tie=("layer0", "layer3"))
    names, _ = scaling_from_profile(prof)
    ties = tied_weights(prof, names)
    assert ties == [TiedWeight((0, 3), 400_000)]
    layers = [LayerCost(1.0, 1.0, 10, b) for b in (400_000, 4096, 4096, 4096)]
    # stage 1 (layers 2, 3) holds the same Parameter: its replicas reduce it too
    assert [c.param_bytes for c in with_held_bytes(layers, ties, [2])] == [400_000, 4096, 4096, 404_096]
    assert [c.param_bytes for c in with_held_bytes(layers, ties, [1])] == [400_000, 4096, 4096, 404_096]
    tied_s = tied_allreduce_s(ties, [2], 4, 2, CLUSTER)
    assert tied_s[0] == tied_s[1] > 0.05  # 400 kB summed over the two positions at 10 Mbit/s

    auto = simulate_pipeline(prof, CLUSTER, OPTS)
    assert auto.meta["replica_reduce_model"] == "backward"  # the runtime reduces with DDP
    ddp = simulate_pipeline(prof, CLUSTER, dataclasses.replace(OPTS, replica_reduce="ddp"))
    assert ddp.step_time_s == auto.step_time_s
    untied = simulate_pipeline(_profile(), CLUSTER, dataclasses.replace(OPTS, replica_reduce="ddp"))
    # the tied sum waits before every update, and stage 1 reduces 400 kB more
    assert auto.step_time_s >= untied.step_time_s + tied_s[0]
    with pytest.raises(CaramelError, match="replica_reduce='caramel'.*tied weight split across stages"):
        simulate_pipeline(prof, CLUSTER, dataclasses.replace(OPTS, replica_reduce="caramel"))


def test_a_tied_weight_on_one_stage_keeps_caramels_reduction():
    prof = _profile(tie=("layer2", "layer3"), owner=2)  # layer2's weight also used by layer3: both on stage 1
    names, _ = scaling_from_profile(prof)
    assert tied_weights(prof, names) == [TiedWeight((2, 3), 4096)]
    assert tied_allreduce_s(tied_weights(prof, names), [2], 4, 2, CLUSTER) == [0.0, 0.0]
    result = simulate_pipeline(prof, CLUSTER, OPTS)
    assert result.meta["replica_reduce_model"] == "forward"
    assert simulate_pipeline(prof, CLUSTER, dataclasses.replace(OPTS, replica_reduce="caramel")).step_time_s \
        == result.step_time_s


def test_the_chooser_prices_a_tied_layout_as_the_simulator_does():
    from caramel.strategies import STRATEGIES

    prof = _profile(tie=("layer0", "layer3"))
    names, layers = scaling_from_profile(prof)
    result = STRATEGIES.spec("pipeline:replicas=auto,stages=2,microbatches=4").simulate(prof, CLUSTER, 2)
    choice = choose_replicas(layers, prof.batch_size * 4, "1f1b", CLUSTER, stages=2, microbatches=4,
                             optimizer_s=prof.optimizer_time_s, ties=tied_weights(prof, names))
    assert result.meta["replicas_auto"]["counts"] == choice.counts == [2, 2]
    assert result.meta["replica_reduce_model"] == "backward"
    assert result.step_time_s == pytest.approx(choice.predicted_step_s)


def test_frozen_parameters_are_not_reduced():
    _, layers = scaling_from_profile(_profile(frozen=(0,)))
    assert [c.param_bytes for c in layers] == [0, 4096, 4096, 4096]
    names, _ = scaling_from_profile(_profile(tie=("layer0", "layer3"), frozen=(0,)))
    assert tied_weights(_profile(tie=("layer0", "layer3"), frozen=(0,)), names) == []


def test_unknown_reduction_modes_and_a_single_replica_are_refused():
    with pytest.raises(CaramelError, match=r"stage_buckets: mode must be .*'forward'.*'backward'.*got 'bogus'"):
        stage_buckets([1.0], [1.0], [10], 2, CLUSTER, 0.0, "bogus")
    with pytest.raises(CaramelError, match=r"stage_costs: reduce must be one of .*got 'bogus'"):
        stage_costs([LayerCost(1.0, 1.0, 10, 10)] * 2, [1], CLUSTER, 2, reduce="bogus")
    with pytest.raises(CaramelError, match=r"equal replicas of gpipe or 1f1b only \(replicas >= 2\)"):
        simulate_pipeline(_profile(), CLUSTER, dataclasses.replace(OPTS, replicas=1), reduce="forward")
    with pytest.raises(CaramelError, match="reducer must be 'caramel' or 'ddp', got 'nccl'"):
        choose_replicas([ScalingCost(0.0, 1e-3, 0.0, 1e-3, 10, 10)] * 2, 4, "gpipe", CLUSTER, reducer="nccl")


def test_the_overlapped_reduction_changes_the_choice():
    # the last layer holds 2 MB: after the drain its reduction favours 3+1 and many microbatches;
    # overlapped with the next fill (as the engine runs it) an equal 2+2 of 2 microbatches wins
    layers = [ScalingCost(0.0, 7e-4, 0.0, 7e-4, 4000, 0), ScalingCost(0.0, 9e-4, 0.0, 2.5e-4, 4000, 0),
              ScalingCost(0.0, 9.5e-4, 0.0, 9e-4, 4000, 2_000_000)]
    cluster = ClusterSpec.uniform(4, 1e9, 5e-4)
    overlapped = choose_replicas(layers, 12, "gpipe", cluster, stages=2)
    after = choose_replicas(layers, 12, "gpipe", cluster, stages=2, reduce="after", transport="eager")  # the old chooser
    assert (overlapped.counts, overlapped.microbatches) == ([2, 2], 2)
    assert (after.counts, after.microbatches) == ([3, 1], 12)
    # DDP's reduction (the backward waits for it) prices the equal candidates higher than the engine's
    ddp = choose_replicas(layers, 12, "gpipe", cluster, stages=2, microbatches=2, reducer="ddp")
    engine = choose_replicas(layers, 12, "gpipe", cluster, stages=2, microbatches=2)
    assert ddp.counts == engine.counts == [2, 2] and ddp.predicted_step_s > engine.predicted_step_s
