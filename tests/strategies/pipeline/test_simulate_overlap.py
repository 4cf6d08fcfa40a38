"""The replicas' reduction overlapped with the pipeline (`overlap.py`), on hand-computed timelines."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.strategies.pipeline.overlap import ReduceBuckets, replay_overlapped, stage_buckets
from caramel.strategies.pipeline.replay import replay, schedule_actions
from caramel.strategies.pipeline.simulate import StageCosts
from caramel.topology.spec import ClusterSpec


def _one_bucket(reduce_s: float, backward_s: float = 1.0) -> ReduceBuckets:
    """A stage whose parameters are one bucket, ready when its backward ends, needed at once."""
    return ReduceBuckets([reduce_s], [backward_s], [0.0], [0.0], [reduce_s])


def _costs(r0: float, r1: float) -> StageCosts:
    # 2 stages x 2 replicas, F = B = 1 per microbatch, free links; all-reduce of r0 and r1
    return StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [r0, r1], [0.0, 0.0], [_one_bucket(r0), _one_bucket(r1)])


def test_the_last_stages_reduction_hides_under_the_drain_and_the_next_fill():
    # GPipe, 2 microbatches. Without any reduction a step is 6: lane 0 F0 0-1, F1 1-2; lane 1
    # F0 1-2, F1 2-3, B0 3-4, B1 4-5; lane 0 B0 4-5, B1 5-6. Caramel's engine starts stage 1's
    # all-reduce (2) at 5, when its last backward ends, and stage 0's (0.5) at 6; the next step's
    # F0 on lane 0 waits for stage 0's (6.5), its F0 reaches lane 1 at 7.5, after stage 1's ended
    # (7): the step is 6 + 0.5, only stage 0's reduction exposed. The old pricing (after the
    # drain, serial) gives max(6 + 0.5, 5 + 2) = 7.
    acts = schedule_actions("gpipe", 2, 2, 2)
    costs = _costs(0.5, 2.0)
    assert replay(dataclasses.replace(costs, allreduce_s=[]), acts).step_time_s == pytest.approx(6.0)
    assert replay(costs, acts).step_time_s == pytest.approx(7.0)
    sim = replay_overlapped(costs, acts, "forward")
    assert sim.step_time_s == pytest.approx(6.5)
    assert sim.busy_s == pytest.approx([4.0, 4.0])


def test_a_reduction_longer_than_the_fill_is_exposed_on_its_stage():
    # stage 1's all-reduce 5 cannot hide: lane 1's next F0 waits for it, so its cycle is its
    # compute (4) plus the reduction (5) = 9 per step, not 6.5; the old pricing 5 + 5 = 10
    acts = schedule_actions("gpipe", 2, 2, 2)
    costs = _costs(0.5, 5.0)
    assert replay(costs, acts).step_time_s == pytest.approx(10.0)
    assert replay_overlapped(costs, acts, "forward").step_time_s == pytest.approx(9.0)


def test_ddp_waits_for_its_buckets_before_the_last_gradient_leaves():
    # DDP's last backward on lane 1 (4-5) returns once stage 1's all-reduce (5-7) is done, so
    # lane 0's B1 runs 7-8, its own all-reduce 8-8.5: the step is 6 + 2 + 0.5, serial
    acts = schedule_actions("gpipe", 2, 2, 2)
    assert replay_overlapped(_costs(0.5, 2.0), acts, "backward").step_time_s == pytest.approx(8.5)


def test_buckets_start_as_the_last_backward_makes_their_gradients():
    # stage 0 (lane 0) of two layers, forward 0.5 each, backward 0.5 each: the later layer's
    # bucket (1.0) is ready half way through the last backward (5.5), the first layer's (0.25)
    # at its end (6). They run 5.5-6.5 and 6.5-6.75. The next F0 computes nothing before the
    # first layer's bucket (6.75), applies its update (0.1), runs layer 0 (6.85-7.35), finds the
    # second bucket done and applies it (0.2) before layer 1 (7.55-8.05). The step is 6 + 0.75
    # + 0.3 of updates; one bucket at the end of the backward would start at 6 and cost 6 + 1.25
    # + 0.3 = 7.55.
    buckets0 = ReduceBuckets([1.0, 0.25], [0.5, 1.0], [0.5, 0.0], [0.2, 0.1], [1.0, 0.25])
    costs = StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [1.25, 0.0], [0.3, 0.0], [buckets0, _one_bucket(0.0)])
    acts = schedule_actions("gpipe", 2, 2, 2)
    assert replay_overlapped(costs, acts, "forward").step_time_s == pytest.approx(7.05)
    whole = dataclasses.replace(costs, buckets=[ReduceBuckets([1.25], [1.0], [0.0], [0.3], [1.25]), _one_bucket(0.0)])
    assert replay_overlapped(whole, acts, "forward").step_time_s == pytest.approx(7.55)


def test_stage_buckets_from_layers():
    cluster = ClusterSpec.uniform(4, 8e6, latency_s=0.0)  # 1 MB/s
    # three layers, the middle without parameters; 2 replicas: each bucket sends its bytes once
    b = stage_buckets([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [100_000, 0, 300_000], 2, cluster, 0.8, "forward")
    assert b.time_s == pytest.approx([0.3, 0.1])  # the last layer's first
    assert b.ready_s == [6.0, 15.0] and b.need_s == [3.0, 0.0]
    assert b.apply_s == pytest.approx([0.6, 0.2])
    # DDP: a first bucket of 1 MiB, then one of up to 25 MiB
    big = stage_buckets([1.0] * 3, [1.0] * 3, [2 << 20, 1 << 20, 1 << 20], 2, cluster, 0.0, "backward")
    assert big.ready_s == [1.0, 3.0] and len(big.time_s) == 2


def test_the_registry_entry_prices_an_equal_hybrids_reduction_as_the_runtime_runs_it():
    from caramel.sim.synthetic import synthetic_profile
    from caramel.strategies.pipeline.options import PipelineOptions
    from caramel.strategies.pipeline.simulate import simulate_pipeline

    # four equal layers, the last two holding 400 kB each: stage 1's reduction dominates
    prof = synthetic_profile(sizes_bytes=[4096, 4096, 400_000, 400_000], times_s=[1, 1, 1, 1])
    cluster = ClusterSpec.uniform(4, 1e7)  # 10 Mbit/s: stage 1's all-reduce ~0.64 s, the compute ~0.1 s
    opts = PipelineOptions(stages=2, replicas=2, schedule="1f1b", microbatches=2, partition="layer2")
    caramel = simulate_pipeline(prof, cluster, opts)
    naive = simulate_pipeline(prof, cluster, opts, reduce="after")
    ddp = simulate_pipeline(prof, cluster, dataclasses.replace(opts, replica_reduce="ddp"))
    assert caramel.meta["replica_reduce_model"] == "forward" and ddp.meta["replica_reduce_model"] == "backward"
    # the last layer's bucket starts half way through stage 1's last backward; the rest of that
    # backward, stage 0's drain and the next fill hide part of it
    assert caramel.step_time_s < naive.step_time_s - 0.01
    assert caramel.step_time_s < ddp.step_time_s
    with pytest.raises(CaramelError, match="reduce must be one of"):
        simulate_pipeline(prof, cluster, opts, reduce="lazy")
    with pytest.raises(CaramelError, match="equal replicas of gpipe or 1f1b only"):
        simulate_pipeline(prof, ClusterSpec.uniform(3, 1e7), dataclasses.replace(opts, replicas="2+1", microbatches=4),
                          reduce="forward")


def test_the_timers_view_counts_the_waits_inside_the_timed_calls():
    # what the runtime's StageTimer measures: its forward_one_chunk holds Caramel's pre-hook waits
    # on the previous step's buckets, its backward_one_chunk DDP's wait for the last backward's.
    # Forward mode, reductions 0.5 and 2 (the first test): lane 0's next F0 starts at 6 and waits
    # for its bucket till 6.5; lane 1's input arrives at 7.5, after its reduction ended (7): no wait
    acts = schedule_actions("gpipe", 2, 2, 2)
    sim = replay_overlapped(_costs(0.5, 2.0), acts, "forward")
    assert sim.busy_s == pytest.approx([4.0, 4.0]) and sim.timed_s == pytest.approx([4.5, 4.0])
    # stage 1's reduction of 5 (5-10): its next F0's input arrives at 7.5 and waits 2.5 inside the forward
    assert replay_overlapped(_costs(0.5, 5.0), acts, "forward").timed_s == pytest.approx([4.5, 6.5])
    # DDP: lane 1's last backward (4-5) returns at 7, lane 0's (7-8) at 8.5
    assert replay_overlapped(_costs(0.5, 2.0), acts, "backward").timed_s == pytest.approx([4.5, 6.0])
    # reduced after the drain, outside the timed calls: the timer's view is the compute
    assert replay(_costs(0.5, 2.0), acts).timed_s == pytest.approx([4.0, 4.0])
