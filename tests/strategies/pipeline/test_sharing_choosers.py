"""The choosers (`replicas="auto"`, `stages="auto"`, `microbatches="auto"`) on a shared host:
each candidate is scored by the host-sharing model the final prediction runs (`sharing.settle`),
so the layout picked is the one that model predicts fastest; unshared hosts choose as before,
bit for bit. No processes: the simulator only."""
from __future__ import annotations

import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.auto_replicas import choose_replicas
from caramel.strategies.pipeline.microbatches import choose_microbatches
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.profile_costs import scaling_from_profile
from caramel.strategies.pipeline.simulate import simulate_pipeline
from caramel.topology.spec import ClusterSpec

# five layers: a 4 MB one early, the slowest (20 ms a sample) in the middle
SIZES = [400_000, 4_000_000, 40_000, 40_000, 4096]
TIMES_S = [0.0026, 0.0057, 0.02, 0.005, 0.0132]
PLAIN = ClusterSpec.uniform(4, 1e9, compute_slowdown=1.8, collective_cpu_s=2e-3)
SHARED = dataclasses.replace(PLAIN, alone_speedup=2.0, ranks_per_host=4)  # 4 ranks on one host, 2x faster alone


def _profile(batch: int = 1, optimizer_s: float | None = None):
    prof = synthetic_profile(sizes_bytes=SIZES, times_s=[t * batch for t in TIMES_S])
    return dataclasses.replace(prof, batch_size=batch,
                               optimizer_time_s=prof.optimizer_time_s if optimizer_s is None else optimizer_s)


def test_replicas_auto_picks_the_layout_the_shared_host_model_predicts_fastest():
    """2-stage, 2-replica cuts: at the all-at-once speeds the one after layer3 is fastest; on
    the shared host a less balanced cut is (its stages compute together less, so each runs
    nearer its alone pace). Candidates replayed at one factor for all, the load applied to the
    pick, gave layer3 (139.2 ms); each candidate settled on its own, layer2 (135.8) of the
    dynamic program's proposals; the search around them (`auto_replicas.descend`) layer1 (127.4)."""
    prof = _profile()
    auto = simulate_pipeline(prof, SHARED, PipelineOptions(replicas="auto"))
    note = auto.meta["replicas_auto"]
    explicit = {cut: simulate_pipeline(prof, SHARED, PipelineOptions(stages=2, replicas=2, microbatches=2,
                                                                     partition=cut)).step_time_s
                for cut in ("layer1", "layer2", "layer3")}
    assert auto.meta["boundaries"] == ["layer1"] and note["counts"] == [2, 2] and note["microbatches"] == 4
    assert explicit["layer1"] < explicit["layer2"] < explicit["layer3"]
    # the chooser's score of its pick is the final prediction of that layout, bit for bit
    assert auto.step_time_s == explicit["layer1"] == min(note["candidates_s"].values())
    # the host's load is what changes the choice: unshared, the same candidates give layer3
    assert simulate_pipeline(prof, PLAIN, PipelineOptions(replicas="auto")).meta["boundaries"] == ["layer3"]


def test_microbatches_auto_scores_each_count_at_its_own_host_load():
    """More microbatches shrink the bubble but keep more ranks computing at once, which a shared
    host slows: on it the model predicts 4 fastest (16 unshared). Before, the count picked at one
    factor was 16 (117.6 ms predicted against 108.0 for 4). The runtime's call (no profile, the
    layers' lines) scores every count as `simulate_pipeline` does, bit for bit."""
    prof = _profile(batch=4, optimizer_s=0.0)  # the chooser prices no optimizer step
    auto = simulate_pipeline(prof, SHARED, PipelineOptions(stages=4, microbatches="auto", schedule="gpipe"))
    explicit = {m: simulate_pipeline(prof, SHARED, PipelineOptions(stages=4, microbatches=m, schedule="gpipe")).step_time_s
                for m in (1, 2, 4, 8, 16)}
    assert auto.meta["microbatches"] == 4 and auto.step_time_s == min(explicit.values()) == explicit[4]
    _, layers = scaling_from_profile(prof)
    direct = choose_microbatches(layers, 16, "gpipe", 4, 4, SHARED)
    assert direct.predicted_step_s == explicit and direct.microbatches == 4
    assert simulate_pipeline(prof, PLAIN, PipelineOptions(stages=4, microbatches="auto", schedule="gpipe")
                             ).meta["microbatches"] == 16


def test_unshared_hosts_choose_as_before_bit_for_bit():
    """Without shared cores every candidate is replayed once at the spec as given: the scores,
    the choices and the cuts are those of the choosers before they modelled sharing (recorded
    from commit 38c6fb3 on this input: a measured contention factor and per-message CPU, so
    the replay is not trivial), and each score is that layout's `simulate_pipeline`."""
    prof = _profile(batch=4, optimizer_s=0.0)
    _, layers = scaling_from_profile(prof)
    choice = choose_replicas(layers, 16, "1f1b", PLAIN)
    assert (choice.plan.boundaries, choice.plan.replicas, choice.microbatches) == ([3], [2, 2], 16)
    assert choice.candidates_s == {
        "2x4": 0.15966687359547688, "2x8": 0.15375616810582968, "2x16": 0.15223900019167522,
        "3x8": 0.22653225806451607, "3x16": 0.22072365591397827, "4x4": 0.20711182795698918,
        "4x8": 0.18667526881720414, "4x16": 0.18165698924731158}
    assert choice.predicted_step_s == simulate_pipeline(
        prof, PLAIN, PipelineOptions(stages=2, replicas=2, microbatches=8, schedule="1f1b",
                                     partition="layer3")).step_time_s
    counts = choose_microbatches(layers, 16, "gpipe", 4, 4, PLAIN)
    assert counts.microbatches == 16 and counts.plan.boundaries == [1, 2, 3]
    assert counts.predicted_step_s == {1: 0.36229999999999996, 2: 0.26058602150537624, 4: 0.21102903225806444,
                                       8: 0.1888505376344085, 16: 0.1829612903225805}
    # (with equal replicas the scores moved when the chooser took the overlapped reduction, next test)


def test_microbatches_auto_prices_equal_replicas_reduction_as_the_runtime_runs_it():
    """With equal replicas the count chooser priced their all-reduce after the drain and no
    optimizer step, where the final prediction overlaps the reduction (`overlap.py`) and adds
    the step: on this input its scores were 1-3% off, and on the shared host with 1f1b it
    picked 4 where the final prediction is fastest at 2. Each score is now that layout's
    `simulate_pipeline`, bit for bit, shared host or not."""
    prof = _profile(batch=8)  # the profile's own optimizer step
    _, layers = scaling_from_profile(prof)
    for cluster in (PLAIN, SHARED):
        for schedule in ("gpipe", "1f1b"):
            choice = choose_microbatches(layers, 16, schedule, 2, 2, cluster, replicas=2,
                                         optimizer_s=prof.optimizer_time_s)
            explicit = {m: simulate_pipeline(prof, cluster, PipelineOptions(stages=2, replicas=2, microbatches=m,
                                                                            schedule=schedule)).step_time_s
                        for m in choice.predicted_step_s}
            assert choice.predicted_step_s == explicit, (cluster.ranks_per_host, schedule)
            auto = simulate_pipeline(prof, cluster, PipelineOptions(stages=2, replicas=2, microbatches="auto",
                                                                    schedule=schedule))
            assert auto.step_time_s == min(explicit.values()) and auto.meta["microbatches"] == choice.microbatches
            # the prediction's own chooser scored every count so (the profile's optimizer step included)
            assert auto.meta["microbatch_predictions_s"] == explicit, (cluster.ranks_per_host, schedule)


def test_a_runtime_that_chooses_plans_at_the_spec_as_given(monkeypatch):
    """The bench hands a pipeline's runtime the speeds its prediction settles at where only the
    cut is the runtime's (`pipeline_plan.runtime_cluster`); a runtime that chooses replicas or
    microbatches gets the spec as given, whose sharing its choosers settle per candidate as the
    prediction's do (scaled speeds would have them model the host twice, or not at all). Under
    the "stage" model each worker gets its own settled factor."""
    from types import SimpleNamespace

    import caramel.bench.pipeline_plan as plan
    import caramel.strategies.pipeline.simulate as simulate

    real = simulate.simulate_pipeline
    monkeypatch.setattr(plan.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(plan.dist, "broadcast_object_list", lambda box, src=0, group=None: None)
    monkeypatch.setattr(simulate, "simulate_pipeline", lambda *a, **k: SimpleNamespace(meta={"sharing": {"factor": 1.5}}))
    assert plan.runtime_cluster(object(), SHARED, PipelineOptions(replicas="auto")) is SHARED
    assert plan.runtime_cluster(object(), SHARED, PipelineOptions(stages=4, microbatches="auto")) is SHARED
    cut_only = plan.runtime_cluster(object(), SHARED, PipelineOptions(stages=4, microbatches=4))
    assert [w.speed for w in cut_only.workers] == [1.5] * 4 and cut_only.ranks_per_host == 1
    # under the "stage" model the prediction settles one factor per worker, and each keeps its own
    monkeypatch.setattr(simulate, "simulate_pipeline", real)
    stage = dataclasses.replace(SHARED, sharing_model="stage")
    prof = synthetic_profile(sizes_bytes=[4096] * 4, times_s=[3, 1, 1, 1])
    opts = PipelineOptions(stages=2, replicas=2, microbatches=4)
    factors = real(prof, stage, opts).meta["sharing"]["factor"]
    assert len(factors) == 4 and factors[0] != factors[2]
    per_worker = plan.runtime_cluster(prof, stage, opts)
    assert [w.speed for w in per_worker.workers] == factors and per_worker.ranks_per_host == 1


def test_the_runtimes_count_chooser_prices_the_profile_as_the_prediction_does():
    """The runtime's `microbatches="auto"` on a handed profile (`PipelinePlanning._simulate_counts`,
    run here without processes), equal replicas reduced by DDP: every count's score is that
    layout's `simulate_pipeline`, shared host or not (the profile's optimizer step and the
    options' reducer, DDP's overlap rather than Caramel's, reach the chooser)."""
    from types import SimpleNamespace

    import torch

    from caramel.strategies.pipeline.runtime_planning import PipelinePlanning

    prof = _profile(batch=8)  # the profile's own optimizer step
    for cluster in (PLAIN, SHARED):
        options = PipelineOptions(stages=2, replicas=2, schedule="gpipe", replica_reduce="ddp")
        planning = PipelinePlanning()
        planning.options, planning.layout, planning.boundaries = options, SimpleNamespace(positions=2), None
        planning.cluster, planning.plan_profile, planning.model = cluster, prof, None
        m, _, table = planning._simulate_counts(torch.zeros(16, 1), None, None, [2, 8])
        explicit = {k: simulate_pipeline(prof, cluster, dataclasses.replace(options, microbatches=k)).step_time_s
                    for k in table}
        assert table == explicit and m == min(explicit, key=lambda k: (explicit[k], k)), cluster.ranks_per_host


@pytest.mark.parametrize("reduce", ["after", "backward"])
def test_microbatches_auto_under_an_explicit_reduce_prices_every_count_in_that_mode(reduce):
    """`simulate_pipeline(reduce=...)` replays the pick with the replicas' reduction in that mode
    ("after": the drain reference before the overlapped model; "backward" under the default
    caramel reducer, whose runtime mode is "forward"): its chooser prices every count so."""
    prof = _profile(batch=8)
    options = PipelineOptions(stages=2, replicas=2, microbatches="auto", schedule="gpipe")
    auto = simulate_pipeline(prof, PLAIN, options, reduce=reduce)
    explicit = {m: simulate_pipeline(prof, PLAIN, dataclasses.replace(options, microbatches=m), reduce=reduce).step_time_s
                for m in (1, 2, 4, 8, 16)}
    assert auto.meta["microbatch_predictions_s"] == explicit and auto.meta["replica_reduce_model"] == reduce
    assert auto.step_time_s == min(explicit.values())


def test_microbatches_auto_refuses_an_overlapped_reduce_for_a_layout_reduced_after_the_drain():
    options = PipelineOptions(stages=2, replicas=1, microbatches="auto", schedule="gpipe")
    with pytest.raises(CaramelError, match="reduce='backward'"):
        simulate_pipeline(_profile(batch=8), PLAIN, options, reduce="backward")
