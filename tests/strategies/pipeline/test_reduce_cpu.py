"""The replicas' buckets' message CPU on the action that issues them (the spec's `reduce_cpu`), on
hand-computed timelines."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import FormatError
from caramel.strategies.pipeline.overlap import ReduceBuckets, bucket_cpu_s, replay_overlapped
from caramel.strategies.pipeline.planner import LayerCost
from caramel.strategies.pipeline.replay import schedule_actions
from caramel.strategies.pipeline.simulate import StageCosts, stage_costs
from caramel.topology.spec import ClusterSpec


def _costs(cpu0_s: float, cpu1_s: float) -> StageCosts:
    # 2 stages x 2 replicas, F = B = 1 per microbatch, free links; one bucket each (0.5, 2.0),
    # ready when the backward's compute ends, needed at once
    b0 = ReduceBuckets([0.5], [1.0], [0.0], [0.0], [0.5], cpu0_s)
    b1 = ReduceBuckets([2.0], [1.0], [0.0], [0.0], [2.0], cpu1_s)
    return StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [0.5, 2.0], [0.0, 0.0], [b0, b1])


def test_the_charge_lengthens_each_stages_last_backward_only():
    # GPipe, 2 microbatches, as test_simulate_overlap's first case (step 6.5 without the charge).
    # With 0.3 on stage 0 and 0.2 on stage 1: lane 1's B1 runs 4-5.2 (its bucket issued when
    # the compute is done, 5-7); lane 0's B1 waits for it, 5.2-6.5, its bucket 6.2-6.7; the next
    # F0 waits for that bucket: 6.7 per step. Each lane's busy time grows by its own charge.
    acts = schedule_actions("gpipe", 2, 2, 2)
    before = replay_overlapped(_costs(0.0, 0.0), acts, "forward")
    after = replay_overlapped(_costs(0.3, 0.2), acts, "forward")
    assert before.step_time_s == pytest.approx(6.5) and before.busy_s == pytest.approx([4.0, 4.0])
    assert after.step_time_s == pytest.approx(6.7)
    assert after.busy_s == pytest.approx([4.3, 4.2])
    # the timer's view: lane 0's gated F0 still waits 6.5 -> 6.7 for its bucket, outside its compute
    assert after.timed_busy_s[0] == pytest.approx(4.3 + 0.2)


def test_the_charge_is_wall_time_not_slowed_beside_the_wires():
    # as the first case with compute 2x slower beside a transfer: each last backward's compute
    # ends as its bucket is issued (lane 1 at 5, lane 0 at 6.2), so only the charge (5-5.2,
    # 6.2-6.5) runs beside a bucket; charged as wall time it stays 0.2 and 0.3, so nothing moves
    # (stretched by the slowdown it would be 0.4 and 0.55: step 6.95)
    acts = schedule_actions("gpipe", 2, 2, 2)
    sim = replay_overlapped(_costs(0.3, 0.2), acts, "forward", compute_slowdown=2.0)
    assert sim.step_time_s == pytest.approx(6.7)
    assert sim.busy_s == pytest.approx([4.3, 4.2])


def test_a_charge_on_the_first_stage_hides_behind_its_bucket():
    # only stage 0 charged (0.3): its B1 runs 5-6.3, its bucket still 6-6.5 (issued at the
    # compute's end), so the next F0 starts at 6.5 as before: the step does not move, the
    # stage's busy time does
    acts = schedule_actions("gpipe", 2, 2, 2)
    sim = replay_overlapped(_costs(0.3, 0.0), acts, "forward")
    assert sim.step_time_s == pytest.approx(6.5) and sim.busy_s == pytest.approx([4.3, 4.0])


def test_one_buckets_cpu_is_the_ring_messages_of_its_replicas():
    cluster = ClusterSpec.uniform(4, 1e9, collective_cpu_s=0.003, reduce_cpu="messages")
    # 2 replicas of 4 ranks: 4 (r - 1) = 4 message ends at collective_cpu_s / (4 (n - 1)) = 0.25 ms
    assert bucket_cpu_s(cluster, 2) == pytest.approx(0.001)
    assert bucket_cpu_s(cluster, 4) == pytest.approx(0.003)  # the whole job's ring: one collective's CPU
    assert bucket_cpu_s(cluster, 1) == 0.0
    assert bucket_cpu_s(dataclasses.replace(cluster, reduce_cpu="none"), 2) == 0.0


def test_stage_costs_charge_every_bucket_where_the_spec_says_so():
    # stage 0: two layers with parameters, one without; stage 1: one with parameters
    layers = [LayerCost(0.01, 0.02, 1000, 4000), LayerCost(0.01, 0.02, 1000, 0), LayerCost(0.01, 0.02, 1000, 4000),
              LayerCost(0.01, 0.02, 1000, 8000)]
    on = ClusterSpec.uniform(4, 1e9, collective_cpu_s=0.003, reduce_cpu="messages")
    off = dataclasses.replace(on, reduce_cpu="none")
    charged = stage_costs(layers, [3], on, 2, reduce="forward")
    assert [b.cpu_s for b in charged.buckets] == pytest.approx([0.002, 0.001])
    plain = stage_costs(layers, [3], off, 2, reduce="forward")
    assert [b.cpu_s for b in plain.buckets] == [0.0, 0.0]
    # nothing else moves: the same costs but the charge
    assert dataclasses.replace(charged, buckets=[dataclasses.replace(b, cpu_s=0.0) for b in charged.buckets]) == plain


def test_the_spec_writes_the_field_only_where_it_charges():
    on = ClusterSpec.uniform(4, 1e9, collective_cpu_s=0.003, reduce_cpu="messages")
    d = on.to_dict()
    assert d["format"] == "caramel.cluster/4" and d["reduce_cpu"] == "messages"
    assert ClusterSpec.from_dict(d).reduce_cpu == "messages"
    off = dataclasses.replace(on, reduce_cpu="none").to_dict()
    assert off["format"] == "caramel.cluster/1" and "reduce_cpu" not in off  # as written before the field
    assert ClusterSpec.from_dict(off).reduce_cpu == "none"
    with pytest.raises(FormatError, match=r"field 'reduce_cpu' must be one of none, messages, got 'bytes'"):
        ClusterSpec.uniform(4, 1e9, reduce_cpu="bytes")
    # a file that says an older version but holds the field is mislabelled: refused, not read with the charge
    with pytest.raises(FormatError, match=r"field 'reduce_cpu' is new in cluster/4, but the file says 'caramel.cluster/3'"):
        ClusterSpec.from_dict({**d, "format": "caramel.cluster/3"})
    with pytest.raises(FormatError, match=r"field 'sharing_model' is new in cluster/3"):
        ClusterSpec.from_dict({**off, "format": "caramel.cluster/2", "sharing_model": "stage"})


def test_the_cli_keeps_the_charge_of_a_spec_file(tmp_path):
    import argparse

    from caramel.commands.common import cluster_from_args

    ClusterSpec.uniform(4, 1e9, collective_cpu_s=0.003, reduce_cpu="messages").save(tmp_path / "c.json")
    args = argparse.Namespace(cluster=str(tmp_path / "c.json"), workers=None, servers=None, bandwidth=None,
                              latency=None, topology=None, collective=None, _default_workers=2)
    assert cluster_from_args(args).reduce_cpu == "messages"
    args.workers = 2  # resized: the charge stays
    assert cluster_from_args(args).reduce_cpu == "messages"


def test_a_pipeline_record_says_whether_the_charge_was_on():
    from caramel.bench.pipeline_plan import cluster_summary

    on = ClusterSpec.uniform(4, 1e9, collective_cpu_s=0.003, reduce_cpu="messages")
    assert cluster_summary(on)["reduce_cpu"] == "messages"
    assert cluster_summary(dataclasses.replace(on, reduce_cpu="none"))["reduce_cpu"] == "none"
