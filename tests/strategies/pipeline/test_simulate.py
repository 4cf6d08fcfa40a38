"""The pipeline simulator: bubbles against (p-1)/(m+p-1), transfers, interleaving, the registry entry."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.replay import replay, schedule_actions
from caramel.strategies.pipeline.simulate import StageCosts, simulate_pipeline
from caramel.topology.spec import ClusterSpec


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 16), (3, 7)])
def test_bubble_fraction_is_the_closed_form(schedule, p, m):
    f, b = 1.0, 2.0
    sim = replay(StageCosts([f] * p, [b] * p, [0.0] * (p - 1)), schedule_actions(schedule, p, p, m))
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert sim.step_time_s == pytest.approx((m + p - 1) * (f + b))


def test_interleaving_shrinks_the_bubble_and_transfers_stretch_the_step():
    p, m, v = 2, 4, 2
    plain = replay(StageCosts([1.0] * p, [2.0] * p, [0.0]), schedule_actions("1f1b", p, p, m))
    inter = replay(StageCosts([0.5] * (p * v), [1.0] * (p * v), [0.0] * (p * v - 1)),
                   schedule_actions("interleaved", p * v, p, m))
    assert inter.bubble_fraction < plain.bubble_fraction
    # GPipe streams its forwards: one forward and one backward hop show; 1F1B waits a round trip per microbatch
    slow = replay(StageCosts([1.0] * p, [2.0] * p, [0.5]), schedule_actions("gpipe", p, p, m))
    assert slow.step_time_s == pytest.approx(plain.step_time_s + 2 * 0.5)
    slow = replay(StageCosts([1.0] * p, [2.0] * p, [0.5]), schedule_actions("1f1b", p, p, m))
    assert slow.step_time_s == pytest.approx(17.0)  # by hand: 15 s of compute, stage 0's last backward at 15-17


def test_replica_allreduce_ends_the_step_and_deadlock_is_an_error():
    acts = schedule_actions("gpipe", 2, 2, 2)
    base = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0]), acts)
    synced = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [0.0, 3.0]), acts)
    assert synced.step_time_s == pytest.approx(max(base.finish_s[0], base.finish_s[1] + 3.0))
    with pytest.raises(CaramelError, match="deadlocks"):
        replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0]), [[(0, "B", 0)], [(1, "F", 0), (1, "B", 0)]])


def test_each_stage_pays_its_share_of_the_optimizer_step_after_its_reduce():
    from caramel.strategies.pipeline.planner import LayerCost
    from caramel.strategies.pipeline.simulate import stage_costs

    layers = [LayerCost(1.0, 1.0, 8, 300), LayerCost(1.0, 1.0, 8, 100)]
    sc = stage_costs(layers, [1], ClusterSpec.uniform(2, 1e9), speeds=[1.0, 0.5], optimizer_s=0.4)
    assert sc.update_s == pytest.approx([0.3, 0.2])  # 3/4 of the bytes; 1/4 on a worker at half speed
    acts = schedule_actions("gpipe", 2, 2, 2)
    base = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0]), acts)
    both = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [0.0, 3.0], [0.5, 0.25]), acts)
    assert both.step_time_s == pytest.approx(max(base.finish_s[0] + 0.5, base.finish_s[1] + 3.0 + 0.25))


def test_simulate_from_a_profile():
    from caramel.profile.profiler import profile_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    prof = profile_model(model, x, y, nn.functional.cross_entropy, steps=1)
    fast = simulate_pipeline(prof, ClusterSpec.uniform(2, 1e10), PipelineOptions(stages=2, microbatches=4))
    slow = simulate_pipeline(prof, ClusterSpec.uniform(2, 1e6), PipelineOptions(stages=2, microbatches=4))
    assert 0 < fast.step_time_s < slow.step_time_s
    assert fast.meta["boundaries"] and 0 < fast.meta["bubble_fraction"] < 1
    cut = simulate_pipeline(prof, ClusterSpec.uniform(2, 1e10), PipelineOptions(stages=2, partition="4"))
    assert cut.meta["boundaries"] == ["4"]


def _profile_at_two_sizes():
    from caramel.profile.profiler import profile_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    return profile_model(model, x, y, nn.functional.cross_entropy, steps=1, small_batch_size=8)


def _set_affine_times(prof, fixed_s: float, per_sample_s: float):
    """Every module's forward fixed_s + per_sample_s x samples (backward twice that), at both sizes."""
    for m in prof.modules:
        m.forward_time_s, m.small_batch_forward_time_s = (fixed_s + per_sample_s * prof.batch_size,
                                                          fixed_s + per_sample_s * prof.small_batch_size)
        m.backward_time_s, m.small_batch_backward_time_s = 2 * m.forward_time_s, 2 * m.small_batch_forward_time_s


def test_a_profile_at_two_sizes_gives_each_layer_a_fixed_cost_per_microbatch():
    from caramel.strategies.pipeline.profile_costs import costs_from_profile

    prof = _profile_at_two_sizes()
    assert prof.small_batch_size == 8
    assert all(m.small_batch_forward_time_s is not None and m.small_batch_backward_time_s is not None for m in prof.modules)
    _set_affine_times(prof, fixed_s=1e-3, per_sample_s=1e-4)
    names, costs = costs_from_profile(prof, microbatches=4, batches=2)  # 16 samples per microbatch
    per_layer = {n: sum(1 for m in prof.modules if m.name.split(".")[0] == n) for n in names}
    for n, c in zip(names, costs):
        assert c.forward_s == pytest.approx(per_layer[n] * (1e-3 + 1e-4 * 16))
        assert c.backward_s == pytest.approx(2 * c.forward_s)
    prof.small_batch_size = None  # one size: times proportional to the samples, no fixed cost
    _, scaled = costs_from_profile(prof, microbatches=4, batches=2)
    for n, c in zip(names, scaled):
        assert c.forward_s == pytest.approx(per_layer[n] * (1e-3 + 1e-4 * 32) * 16 / 32)


def test_auto_microbatches_take_the_fixed_cost_from_a_two_size_profile():
    prof = _profile_at_two_sizes()
    _set_affine_times(prof, fixed_s=5e-3, per_sample_s=1e-5)  # calls dominate: few microbatches
    cluster = ClusterSpec.uniform(2, 1e10)
    two = simulate_pipeline(prof, cluster, PipelineOptions(stages=2, schedule="gpipe"))
    prof.small_batch_size = None
    one = simulate_pipeline(prof, cluster, PipelineOptions(stages=2, schedule="gpipe"))
    assert "two batch sizes" in two.meta["microbatches_auto"] and "one batch size" in one.meta["microbatches_auto"]
    assert two.meta["microbatches"] == 1 < one.meta["microbatches"]


def test_small_batch_profiles_are_checked():
    from caramel.errors import FormatError
    from caramel.profile.model_profile import ModelProfile
    from caramel.profile.profiler import profile_model

    prof = _profile_at_two_sizes()
    again = ModelProfile.from_dict(prof.to_dict())
    assert again.small_batch_size == 8 and [m.small_batch_forward_time_s for m in again.modules] == \
        [m.small_batch_forward_time_s for m in prof.modules]
    for bad in (0, 32, "8"):
        with pytest.raises(FormatError, match="small_batch_size"):
            ModelProfile.from_dict({**prof.to_dict(), "small_batch_size": bad})
    model = nn.Sequential(nn.Linear(16, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for bad in (0, 8):
        with pytest.raises(CaramelError, match=r"small_batch_size must be in \[1, 8\)"):
            profile_model(model, x, y, nn.functional.cross_entropy, steps=1, small_batch_size=bad)
    other = profile_model(model, x, y, nn.functional.cross_entropy, steps=1)
    with pytest.raises(CaramelError, match="another model"):
        prof.with_small_batch(other)


def test_unequal_replicas_replay_the_runtimes_round_robin():
    from caramel.strategies.pipeline.replay import replicated_actions
    from caramel.strategies.pipeline.unequal import virtual_chains

    # stage 0 (F = B = 2) on 2 replicas, stage 1 (F = B = 1) on 1, GPipe, 4 microbatches, free links.
    # rank 0 runs virtual pipeline 0 (m0, m2), rank 1 pipeline 1 (m1, m3), rank 2 both in turn:
    #   rank 0  F0 0-2, F2 2-4,                 B0 6-8, B2 8-10
    #   rank 1  F1 0-2, F3 2-4,                                  B1 10-12, B3 12-14
    #   rank 2  F0 2-3, F2 4-5, B0 5-6, B2 6-7, F1 7-8, F3 8-9, B1 9-10, B3 10-11
    lanes = replicated_actions("gpipe", (2, 1), 4)
    assert lanes[0] == [(0, "F", 0), (0, "F", 2), (0, "B", 0), (0, "B", 2)]
    assert lanes[2] == [(1, k, m) for m2 in ((0, 2), (1, 3)) for k in "FB" for m in m2]
    sim = replay(StageCosts([2.0, 1.0], [2.0, 1.0], [0.0]), lanes)
    assert sim.step_time_s == pytest.approx(14.0) and sim.busy_s == pytest.approx([8.0, 8.0, 8.0])
    # every action sits on the rank the runtime's layout gives its microbatch (`unequal.virtual_chains`)
    for counts, schedule, m in (((2, 1), "gpipe", 4), ((1, 3), "1f1b", 6), ((3, 2), "gpipe", 12),
                                ((1, 2, 1), "1f1b", 6)):
        chains, period = virtual_chains(counts), len(virtual_chains(counts))
        lanes = replicated_actions(schedule, counts, m)
        assert sorted(a for lane in lanes for a in lane) == sorted((s, k, i) for s in range(len(counts))
                                                                   for k in "FB" for i in range(m))
        assert all(chains[i % period][s] == rank for rank, lane in enumerate(lanes) for s, _, i in lane)
        replay(StageCosts([1.0] * len(counts), [2.0] * len(counts), [0.1] * (len(counts) - 1)), lanes)  # no deadlock
    # equal counts of one are the plain schedule
    assert replicated_actions("1f1b", (1, 1), 4) == schedule_actions("1f1b", 2, 2, 4)
    with pytest.raises(CaramelError, match="microbatches must be a multiple of 6"):
        replicated_actions("gpipe", (2, 3), 4)


def test_simulate_unequal_replicas_from_a_profile():
    from caramel.profile.profiler import profile_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    prof = profile_model(model, x, y, nn.functional.cross_entropy, steps=1)
    cluster = ClusterSpec.uniform(3, 1e10)
    sim = simulate_pipeline(prof, cluster, PipelineOptions(stages=2, replicas="2+1", schedule="gpipe", microbatches=4,
                                                           partition="4"))  # the heavy layers on 2 replicas
    assert sim.world_size == 3 and sim.num_items == 4
    # the planner's stage times (a stage on r replicas as a worker r times as fast) and the replayed
    # lanes (each replica computing its microbatches) agree on the busiest rank's compute per step
    assert sim.compute_time_s == pytest.approx(sim.meta["predicted_slowest_stage_s"])
    auto = simulate_pipeline(prof, cluster, PipelineOptions(stages=2, replicas="2+1", schedule="1f1b"))
    assert auto.num_items % 2 == 0 and auto.num_items // 2 >= 2  # a multiple of the period, 1F1B's bound per pipeline


def _with_speeds(speeds: list[float]) -> ClusterSpec:
    from caramel.topology.spec import WorkerSpec

    return ClusterSpec([WorkerSpec(f"w{i}", sp) for i, sp in enumerate(speeds)], 1e10)


def test_each_stage_runs_at_its_slowest_workers_speed_in_the_runtimes_rank_layout():
    from caramel.strategies.pipeline.layout import stage_speeds

    # unequal counts, ranks stage-major: 2+1 is stage 0 on ranks 0, 1 and stage 1 on rank 2
    assert stage_speeds([1.0, 1.0, 0.25], (2, 1)) == [1.0, 0.25]
    assert stage_speeds([1.0, 0.25, 1.0], (2, 1)) == [0.25, 1.0]
    assert stage_speeds([0.5, 1.0, 1.0, 0.75], (1, 2, 1)) == [0.5, 1.0, 0.75]
    # equal hybrid: rank = position x replicas + replica; interleaved: stage k on position k mod positions
    assert stage_speeds([1.0, 0.5, 1.0, 1.0], (2, 2)) == [0.5, 1.0]
    assert stage_speeds([1.0, 1.0, 1.0, 0.5], (2, 2, 2, 2), positions=2) == [1.0, 0.5, 1.0, 0.5]
    assert stage_speeds([0.5], (1, 1)) == [0.5, 1.0]  # a spec with fewer workers: the rest at full speed
    # the runtime's planner reads the same (its cluster spec, this rank's layout)
    from types import SimpleNamespace

    from caramel.strategies.pipeline.runtime import Pipeline

    pipe = SimpleNamespace(cluster=_with_speeds([1.0, 1.0, 0.25]), layout=SimpleNamespace(positions=2),
                           options=PipelineOptions(replicas="2+1", microbatches=4))
    assert Pipeline._cluster_and_speeds(pipe)[1] == [1.0, 0.25]


def test_a_slow_worker_slows_the_step_of_the_stage_it_runs():
    prof = _profile_at_two_sizes()
    _set_affine_times(prof, fixed_s=1e-4, per_sample_s=1e-4)
    unequal = PipelineOptions(stages=2, replicas="2+1", schedule="gpipe", microbatches=4, partition="2")
    uniform = simulate_pipeline(prof, _with_speeds([1.0, 1.0, 1.0]), unequal).step_time_s
    slow_last = simulate_pipeline(prof, _with_speeds([1.0, 1.0, 0.25]), unequal)
    slow_replica = simulate_pipeline(prof, _with_speeds([1.0, 0.25, 1.0]), unequal)
    assert slow_last.step_time_s > 1.5 * uniform  # the one stage-1 worker at a quarter speed
    # a slow stage-0 replica slows stage 0 (the first layers), not stage 1: the two differ
    assert slow_replica.step_time_s > 1.5 * uniform and slow_replica.step_time_s != slow_last.step_time_s
    assert slow_replica.critical_path["stage_times_s"][0] > slow_last.critical_path["stage_times_s"][0]
    # equal hybrid (ranks 2, 3 hold stage 1): the slow rank 3 is no longer read as a stage-0 worker
    hybrid = PipelineOptions(stages=2, replicas=2, schedule="gpipe", microbatches=4, partition="2")
    assert simulate_pipeline(prof, _with_speeds([1.0, 1.0, 1.0, 0.25]), hybrid).step_time_s > \
        1.5 * simulate_pipeline(prof, _with_speeds([1.0] * 4), hybrid).step_time_s


def test_a_tied_weight_split_across_stages_adds_its_gradients_all_reduce():
    from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo

    def profile(head_uses_tok: bool) -> ModelProfile:
        tok = ParamInfo(0, "tok.weight", [1000, 1000], "float32", 10 ** 6, 4 * 10 ** 6, True,
                        use_modules=["tok", "head"] if head_uses_tok else ["tok"])
        blk = ParamInfo(1, "blk.weight", [10, 10], "float32", 100, 400, True, use_modules=["blk"])
        mods = [ModuleInfo(n, "Linear", 0.0, 0.01, 0.02, params=ps, input_bytes=4000)
                for n, ps in [("tok", [0]), ("blk", [1]), ("head", [])]]
        return ModelProfile(model="tied", batch_size=8, forward_time_s=0.03, backward_time_s=0.06,
                            optimizer_time_s=0.0, params=[tok, blk], modules=mods)

    cluster = ClusterSpec.uniform(2, 1e9, 1e-4)
    opts = PipelineOptions(stages=2, microbatches=2, partition="blk")
    tied, untied = simulate_pipeline(profile(True), cluster, opts), simulate_pipeline(profile(False), cluster, opts)
    # the first and the last stage sum the 4 MB gradient: a 2-member ring all-reduce at the link rate
    assert tied.step_time_s - untied.step_time_s == pytest.approx(2 * 1e-4 + 4e6 * 8 / 1e9)
    # both uses on one stage: autograd sums them there, nothing to send
    one = PipelineOptions(stages=2, microbatches=2, partition="head")
    prof = profile(True)
    prof.params[0].use_modules = ["tok", "blk"]
    assert simulate_pipeline(prof, cluster, one).step_time_s == pytest.approx(
        simulate_pipeline(profile(False), cluster, one).step_time_s)


def test_each_message_costs_its_share_of_the_measured_collective_cpu():
    from caramel.strategies.pipeline.planner import LayerCost, message_cpu_s
    from caramel.strategies.pipeline.simulate import stage_costs

    # a ring all-reduce over 4 ranks sends 6 messages and receives 6 on each: 12 ends per collective
    assert message_cpu_s(ClusterSpec.uniform(4, 1e9, collective_cpu_s=2.4e-3)) == pytest.approx(0.2e-3)
    assert message_cpu_s(ClusterSpec.uniform(1, 1e9, collective_cpu_s=2.4e-3)) == 0.0
    layers = [LayerCost(0.01, 0.02, 1000, 100)] * 3
    plain = stage_costs(layers, [1, 2], ClusterSpec.uniform(3, 1e9))
    paused = stage_costs(layers, [1, 2], ClusterSpec.uniform(3, 1e9, collective_cpu_s=8e-3))
    # 8 ms / (4 x 2) = 1 ms per end: the end stages send or receive one message per action, the middle two
    assert [b - a for a, b in zip(plain.forward_s, paused.forward_s)] == pytest.approx([1e-3, 2e-3, 1e-3])
    assert [b - a for a, b in zip(plain.backward_s, paused.backward_s)] == pytest.approx([1e-3, 2e-3, 1e-3])
    assert paused.transfer_s == plain.transfer_s
    # in a whole simulation it costs more with more microbatches (more messages for the same bytes)
    profile = _profile_at_two_sizes()
    for m in (2, 4):
        opts = PipelineOptions(stages=2, microbatches=m, partition="2")
        base = simulate_pipeline(profile, ClusterSpec.uniform(2, 1e9), opts)
        more = simulate_pipeline(profile, ClusterSpec.uniform(2, 1e9, collective_cpu_s=4e-3), opts)
        # 2 ranks: 1 ms per end; each rank's m forwards and m backwards each send or receive one
        assert more.compute_time_s - base.compute_time_s == pytest.approx(2 * m * 1e-3, rel=1e-6)
