"""The pipeline simulator's contention and send-completion terms, on hand-computed timelines."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.strategies.pipeline.replay import replay, replicated_actions, schedule_actions
from caramel.strategies.pipeline.simulate import StageCosts, profiled_cuts


def test_compute_beside_a_transfer_runs_the_measured_factor_slower():
    # 2 stages, GPipe, 2 microbatches, F = B = 1, each transfer 1, compute_slowdown 2. By hand
    # (a transfer slows its sender's and its receiver's compute while on the wire):
    #   lane 0  F0 0-1 (sends 1-2), F1 1-2.5 (half speed beside 1-2; sends 2.5-3.5)
    #   lane 1  F0 2-3.5 (half speed beside 2.5-3.5), F1 3.5-4.5, B0 4.5-5.5 (sends 5.5-6.5),
    #           B1 5.5-7 (half speed beside its own send until 6.5; sends 7-8)
    #   lane 0  B0 6.5-8 (half speed beside B1's gradient from 7), B1 8-9
    acts = schedule_actions("gpipe", 2, 2, 2)
    costs = StageCosts([1.0, 1.0], [1.0, 1.0], [1.0])
    plain = replay(costs, acts)
    slowed = replay(costs, acts, compute_slowdown=2.0)
    assert plain.step_time_s == pytest.approx(8.0) and plain.busy_s == pytest.approx([4.0, 4.0])
    assert slowed.step_time_s == pytest.approx(9.0)
    assert slowed.busy_s == pytest.approx([5.0, 5.0])  # the slowed compute is busy time, as the runtime measures it
    # free links: nothing on the wire, nothing slowed
    free = StageCosts([1.0, 1.0], [1.0, 1.0], [0.0])
    assert replay(free, acts, compute_slowdown=3.0).step_time_s == pytest.approx(replay(free, acts).step_time_s)
    with pytest.raises(CaramelError, match="compute_slowdown must be >= 1"):
        replay(costs, acts, compute_slowdown=0.5)


def test_a_rank_starts_its_next_virtual_pipeline_once_its_sends_have_landed():
    # 2+1, GPipe, 4 microbatches, stage 0 F = B = 2, stage 1 F = B = 1, transfers 0.5. Rank 2 runs
    # virtual pipeline 0 (m0, m2) then 1 (m1, m3):
    #   rank 2  F0 2.5-3.5, F2 4.5-5.5, B0 5.5-6.5 (lands 7), B2 6.5-7.5 (lands 8);
    #           torch's schedule returns once B2's gradient has landed: F1 8-9 (not 7.5), F3 9-10,
    #           B1 10-11 (lands 11.5), B3 11-12 (lands 12.5)
    #   rank 1  F1 0-2, F3 2-4, B1 11.5-13.5, B3 13.5-15.5
    lanes = replicated_actions("gpipe", (2, 1), 4)
    costs = StageCosts([2.0, 1.0], [2.0, 1.0], [0.5])
    assert replay(costs, lanes).step_time_s == pytest.approx(15.0)  # without the virtual pipelines' boundaries
    sim = replay(costs, lanes, period=2)
    assert sim.step_time_s == pytest.approx(15.5)
    assert sim.finish_s == pytest.approx([11.0, 15.5, 12.5])  # rank 2 ends when its last send lands
    # with free links the schedules' boundaries cost nothing (the hand-computed 14 units of test_simulate)
    assert replay(StageCosts([2.0, 1.0], [2.0, 1.0], [0.0]), lanes, period=2).step_time_s == pytest.approx(14.0)


def test_an_explicit_partition_maps_onto_the_profiled_layers():
    names = ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc"]
    assert profiled_cuts(names, ["layer2", "layer4"]) == [3, 5]
    assert profiled_cuts(["0", "1", "3", "4"], [2]) == [2]  # a Sequential's index: the first layer at or after it
    with pytest.raises(CaramelError, match=r"partition 'layer2.0'.*top-level modules"):
        profiled_cuts(names, ["layer2.0"])


def test_a_lanes_sends_queue_on_its_link():
    # 2 stages, GPipe, 3 microbatches, F = B = 1, each transfer 2: the forwards end 1 apart but the
    # link carries one activation every 2. By hand:
    #   lane 0  F0 0-1, F1 1-2, F2 2-3; sends 1-3, 3-5, 5-7
    #   lane 1  F0 3-4, F1 5-6, F2 7-8, B0 8-9, B1 9-10, B2 10-11; sends 9-11, 11-13, 13-15
    #   lane 0  B0 11-12, B1 13-14, B2 15-16
    sim = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [2.0]), schedule_actions("gpipe", 2, 2, 3))
    assert sim.step_time_s == pytest.approx(16.0)  # 12 if transfers on one link could overlap
    assert sim.busy_s == pytest.approx([6.0, 6.0])


def test_the_registry_entry_takes_the_clusters_measured_slowdown():
    from caramel.profile.model_profile import ModelProfile, ModuleInfo
    from caramel.strategies.pipeline.options import PipelineOptions
    from caramel.strategies.pipeline.simulate import simulate_pipeline
    from caramel.topology.spec import ClusterSpec

    # two layers of 10 ms forward and 20 ms backward per 8 samples, 1 MiB of activations between them
    mods = [ModuleInfo(name=str(k), type="Linear", forward_start_s=0.01 * k, forward_time_s=0.010,
                       backward_time_s=0.020, input_bytes=2 ** 20) for k in range(2)]
    prof = ModelProfile(model="two", batch_size=8, forward_time_s=0.02, backward_time_s=0.04, optimizer_time_s=0.0,
                        params=[], modules=mods)
    options = PipelineOptions(stages=2, schedule="gpipe", microbatches=4, partition="1")
    # 2 x 8 samples in 4 microbatches: 5 ms forwards, 4.2 ms per activation, sent beside the next forward
    # (eager transfers: with gloo's rendezvous stage 1 posts each recv after its previous forward, so
    # no transfer overlaps compute on this step's critical path; test_sim_transport.py)
    slow_link = ClusterSpec.uniform(2, 1e9)
    plain = simulate_pipeline(prof, slow_link, options, transport="eager")
    slowed = simulate_pipeline(prof, dataclasses.replace(slow_link, compute_slowdown=2.0), options, transport="eager")
    assert slowed.step_time_s > plain.step_time_s and slowed.meta["compute_slowdown"] == 2.0
    assert sum(slowed.meta["busy_s_per_lane"]) > sum(plain.meta["busy_s_per_lane"])
