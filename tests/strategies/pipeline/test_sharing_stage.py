"""The per-stage host-sharing factor (`sharing_model="stage"`, `sharing.py`) and its versioning:
each lane's load over its own compute time, each worker its lane's factor, and records that name
no model replaying with one factor per layout, as before. Hand-computed, no processes."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from caramel.errors import FormatError
from caramel.profile.turns import SHARING_KEY, sharing_of
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.sharing import (co_computing, co_computing_per_lane, co_transferring,
                                                 co_transferring_per_lane, host_ranks_at_once_per_lane, one_factor,
                                                 scaled, settle, sharing_factor, with_sharing, worker_factors)
from caramel.strategies.pipeline.simulate import simulate_pipeline
from caramel.strategies.recommend import predict
from caramel.topology.spec import ClusterSpec


def test_each_lane_load_is_read_over_its_own_compute_time():
    # lane 0 computes 0-4, lane 1 2-3: lane 0 sees 1 for 3 of its 4, 2 for 1; lane 1 sees 2 throughout
    spans = [[(0.0, 4.0)], [(2.0, 3.0)]]
    assert co_computing_per_lane(spans) == pytest.approx([1.25, 2.0])
    # weighted by each lane's compute time they give the layout's mean: (1.25 x 4 + 2 x 1) / 5
    assert co_computing(spans) == pytest.approx((1.25 * 4 + 2.0) / 5)
    assert co_computing_per_lane([[(0.0, 1.0)], []]) == [1.0, 1.0]  # a lane that never computes: alone
    # a transfer on lane 1's wire 3-5: lane 0 computes beside it for 1 of its 4, lane 1 not at all
    wires = [[], [(3.0, 5.0)]]
    assert co_transferring_per_lane(spans, wires) == pytest.approx([0.25, 0.0])
    assert co_transferring(spans, wires) == pytest.approx(1 / 5)


def test_each_worker_takes_its_lane_factor_stage_major():
    sim = SimpleNamespace(meta={"replicas": 2, "busy_s_per_lane": [1.0, 1.0]})
    assert worker_factors(sim, [1.5, 1.2], 4) == (1.5, 1.5, 1.2, 1.2)  # ranks position * 2 + replica
    assert worker_factors(sim, [1.5, 1.2], 5) == (1.5, 1.5, 1.2, 1.2, 1.0)  # a rank outside the layout runs nothing
    cluster = ClusterSpec.uniform(4, 1e9, alone_speedup=2.0, ranks_per_host=4)
    fast = scaled(cluster, (1.5, 1.5, 1.2, 1.2))
    assert [w.speed for w in fast.workers] == [1.5, 1.5, 1.2, 1.2] and fast.ranks_per_host == 1
    with pytest.raises(Exception, match="3 factors for a cluster of 4 workers"):
        scaled(cluster, (1.0, 1.0, 1.0))
    # proposals for other layouts take one factor: the workers' weighted by their lane's busy time
    sim.meta["sharing"] = {"factor": [1.5, 1.5, 1.2, 1.2, 1.0]}
    sim.meta["busy_s_per_lane"] = [3.0, 1.0]
    assert one_factor(sim) == pytest.approx((1.5 * 3 * 2 + 1.2 * 2) / 8)  # the fifth worker runs nothing
    assert one_factor(SimpleNamespace(meta={"sharing": {"factor": 1.3}})) == 1.3
    sim.meta["busy_s_per_lane"] = [1.0, 1.0]
    # per lane: computing plus the transfer share, times the replicas a lane stands for, on one host
    sim.meta.update(co_computing_per_lane=[1.5, 2.0], co_transferring_per_lane=[1.0, 0.0])
    assert host_ranks_at_once_per_lane(sim, 4, 0.5) == pytest.approx([4.0, 4.0])
    assert host_ranks_at_once_per_lane(sim, 4, 0.0) == pytest.approx([3.0, 4.0])


def _two_lanes(calls: list):
    """Lane 0 computes 1 / s0 and lane 1 0.5 / s1, side by side from 0: lane 1 always beside
    lane 0, lane 0 beside lane 1 for the shorter's length."""
    def simulate(cluster):
        calls.append(cluster)
        s0, s1 = cluster.workers[0].speed, cluster.workers[1].speed
        spans = [[(0.0, 1 / s0)], [(0.0, 0.5 / s1)]]
        return SimpleNamespace(step_time_s=max(1 / s0, 0.5 / s1), meta={
            "busy_s_per_lane": [1 / s0, 0.5 / s1], "replicas": 1, "co_computing": co_computing(spans),
            "co_computing_per_lane": co_computing_per_lane(spans), "co_transferring_per_lane": [0.0, 0.0]})
    return simulate


def test_the_stage_model_settles_each_lane_at_its_own_load_and_the_layout_model_at_the_mean():
    calls: list = []
    layout = ClusterSpec.uniform(2, 1e9, alone_speedup=2.0, ranks_per_host=2)
    stage = dataclasses.replace(layout, sharing_model="stage")
    one = with_sharing(_two_lanes(calls), layout)
    calls.clear()
    per = with_sharing(_two_lanes(calls), stage)
    assert per.meta["sharing"]["settled"] and per.meta["sharing"]["model"] == "stage"
    f0, f1 = per.meta["sharing"]["factor"]
    k0, k1 = per.meta["sharing"]["ranks_at_once"]
    # lane 1 computes only beside lane 0: 2 at once, its factor 1 (the all-at-once pace)
    assert k1 == pytest.approx(2.0) and f1 == pytest.approx(1.0)
    # lane 0 is beside lane 1 for 0.5 / f1 of its 1 / f0: load 1 + f0 / 2, factor 2 / load = f0 => f0 = sqrt(5) - 1
    assert f0 == pytest.approx(5 ** 0.5 - 1, rel=2e-3) and k0 == pytest.approx(1 + f0 / 2, rel=1e-9)
    assert f0 == pytest.approx(sharing_factor(2, 2.0, k0), rel=2e-3)
    assert [w.speed for w in calls[-1].workers] == pytest.approx([f0, f1], rel=2e-3)
    # one factor from the mean load sits between the two, and prices the long lane slower
    f = one.meta["sharing"]["factor"]
    assert f1 < f < f0 and one.step_time_s > per.step_time_s
    assert one.meta["sharing"]["model"] == "layout" and isinstance(f, float)


def test_simulate_pipeline_replays_the_layout_at_each_stage_settled_speed():
    prof = synthetic_profile(sizes_bytes=[4096] * 4, times_s=[3, 1, 1, 1])
    opts = PipelineOptions(stages=2, replicas=2, schedule="1f1b", microbatches=2, partition=[1])
    shared = ClusterSpec.uniform(4, 1e7, alone_speedup=2.0, ranks_per_host=4, sharing_model="stage")
    sim = simulate_pipeline(prof, shared, opts)
    note = sim.meta["sharing"]
    factors = note["factor"]
    assert len(factors) == 4 and factors[0] == factors[1] and factors[2] == factors[3] and factors[0] != factors[2]
    # each stage's factor is processor sharing at its own lane's settled load
    for lane, k in enumerate(note["ranks_at_once"]):
        assert factors[2 * lane] == pytest.approx(sharing_factor(4, 2.0, k), rel=2e-3)
    # the same as the plain simulation on workers that much faster, each its own
    plain = ClusterSpec.uniform(4, 1e7)
    fast = dataclasses.replace(plain, workers=[dataclasses.replace(w, speed=f) for w, f in zip(plain.workers, factors)])
    assert sim.step_time_s == pytest.approx(simulate_pipeline(prof, fast, opts).step_time_s)


def test_the_choosers_score_their_pick_as_the_stage_model_replays_it():
    # each stage its own factor (4 stages: 4 different ones): a chooser scaling every stage by
    # one worker's factor scores the pick at another step than its replay
    prof = synthetic_profile(sizes_bytes=[4096] * 4, times_s=[3, 1, 1, 1])
    shared = ClusterSpec.uniform(4, 1e7, alone_speedup=2.0, ranks_per_host=4, sharing_model="stage")
    for opts in (PipelineOptions(stages=4, replicas=1, microbatches="auto"),
                 PipelineOptions(stages=2, replicas=2, microbatches="auto")):
        chosen = simulate_pipeline(prof, shared, opts)
        assert chosen.meta["sharing"]["model"] == "stage" and len(set(chosen.meta["sharing"]["factor"])) > 1
        m = chosen.meta["microbatches"]
        replay = simulate_pipeline(prof, shared, dataclasses.replace(opts, microbatches=m))
        assert chosen.meta["microbatch_predictions_s"][m] == pytest.approx(replay.step_time_s, rel=1e-12)
    chosen = simulate_pipeline(prof, shared, PipelineOptions(replicas="auto"))
    note = chosen.meta["replicas_auto"]
    key = f"{len(note['counts'])}x{note['microbatches']}"
    assert chosen.meta["sharing"]["model"] == "stage"
    # the pick is replayed with its counts, microbatches and cut given (`_auto_replicas`)
    assert note["candidates_s"][key] == pytest.approx(chosen.step_time_s, rel=1e-12)


def test_the_model_is_versioned_and_records_without_one_replay_as_before():
    stage = ClusterSpec.uniform(4, 1e9, alone_speedup=2.1, ranks_per_host=4, sharing_model="stage")
    assert stage.to_dict()["format"] == "caramel.cluster/3"
    assert ClusterSpec.from_dict(stage.to_dict()) == stage
    layout = dataclasses.replace(stage, sharing_model="layout")
    assert layout.to_dict()["format"] == "caramel.cluster/2" and "sharing_model" not in layout.to_dict()
    assert "sharing_model" not in ClusterSpec.uniform(2, 1e9).to_dict()  # written exactly as before the field
    # no host sharing: both models predict alike, so the file stays readable by /1 readers
    alone = ClusterSpec.uniform(2, 1e9, sharing_model="stage").to_dict()
    assert alone["format"] == "caramel.cluster/1" and "sharing_model" not in alone
    with pytest.raises(FormatError, match="field 'sharing_model' must be one of layout, stage, got 'lane'"):
        ClusterSpec.uniform(2, 1e9, sharing_model="lane")
    assert stage.sharing_on(2) == {"ranks_per_host": 2, "alone_speedup": 2.1, "sharing_model": "stage"}
    # the profile names the model its run was predicted with; one that names none is the layout's
    prof = synthetic_profile(sizes_bytes=[4096] * 4, times_s=[3, 1, 1, 1])
    prof.meta[SHARING_KEY] = {"alone_speedup": 2.0, "ranks_per_host": 4}
    assert "sharing_model" not in sharing_of(prof)
    old = simulate_pipeline(prof, ClusterSpec.uniform(4, 1e7, **sharing_of(prof)), PipelineOptions(
        stages=2, replicas=2, microbatches=2, partition=[1]))
    for model in ("layout", "stage"):
        prof.meta[SHARING_KEY]["model"] = model
        assert sharing_of(prof)["sharing_model"] == model
        sim = simulate_pipeline(prof, ClusterSpec.uniform(4, 1e7, **sharing_of(prof)), PipelineOptions(
            stages=2, replicas=2, microbatches=2, partition=[1]))
        assert (sim.step_time_s == old.step_time_s) is (model == "layout")
    # a host per rank (every stored run profiled all at once): nothing to spread, the same prediction
    alone = [simulate_pipeline(prof, ClusterSpec.uniform(4, 1e7, sharing_model=m), PipelineOptions(
        stages=2, replicas=2, microbatches=2, partition=[1])) for m in ("layout", "stage")]
    assert alone[0].step_time_s == alone[1].step_time_s and "sharing" not in alone[1].meta
    prof.meta[SHARING_KEY]["model"] = "per-lane"
    with pytest.raises(FormatError, match="'model' must be one of layout, stage, got 'per-lane'"):
        sharing_of(prof)


def test_a_profile_names_the_sharing_models_a_cluster_spec_takes():
    from caramel.profile import turns
    from caramel.topology import spec

    assert turns.SHARING_MODELS == spec.SHARING_MODELS
    assert turns.SHARING_MODEL in turns.SHARING_MODELS


def test_a_stage_model_cycle_is_reported_unsettled_on_its_slowest_pass():
    # lane 0 computes alone (load 1, factor 2) at a factor <= 1.5 and beside lane 1 (load 2,
    # factor 1) above: the per-worker factors swing (1, 1) -> (2, 1) -> (1, 1), a 2-cycle
    cluster = ClusterSpec.uniform(2, 1e9, alone_speedup=2.0, ranks_per_host=2, sharing_model="stage")

    def simulate_at(factor):
        f0 = factor[0]
        return SimpleNamespace(step_time_s=1 / f0, meta={"replicas": 1, "busy_s_per_lane": [1 / f0, 1.0],
                                                         "co_computing_per_lane": [2.0 if f0 > 1.5 else 1.0, 2.0],
                                                         "co_transferring_per_lane": [0.0, 0.0]})
    sim = settle(simulate_at, cluster)
    note = sim.meta["sharing"]
    assert note["settled"] is False and note["passes"] == 2
    assert note["factor"] == [1.0, 1.0] and sim.step_time_s == 1.0  # the slower pass of the two


def test_a_prediction_whose_stage_factors_cycle_is_flagged():
    # seed-0 case 16 of experiments/pipeline_sharing_cycles.py --sharing-model stage: the cut stays
    # layer1+layer2 on every pass, the per-worker factors swing by about 0.1% (4 passes)
    prof = synthetic_profile(sizes_bytes=[133747, 89540, 85900],
                             times_s=[0.016916999979845825, 0.0019472829354693828, 0.016631678541193233])
    prof.batch_size = 8
    spec = ClusterSpec.uniform(3, 64520375.274740115, ranks_per_host=3, alone_speedup=2.998956647019595,
                               sharing_model="stage")
    (p,) = predict(prof, spec, ["pipeline:stages=3,microbatches=8,partition=auto"])
    assert p.step_time_s is not None and p.plan["sharing_unsettled_passes"] == 4
    (q,) = predict(prof, dataclasses.replace(spec, sharing_model="layout"),
                   ["pipeline:stages=3,microbatches=8,partition=auto"])
    assert "sharing_unsettled_passes" not in q.plan  # one factor per layout settles here


RUN_S = Path(__file__).resolve().parents[3] / "docs/results/pipeline_profile_turns/run_s"


def test_a_stored_run_replays_to_the_bit_under_the_layout_model():
    # run S's saved inputs (their profile names no sharing model: "layout") give the pipelines
    # the bench recorded, float for float: a change to the layout path moves them
    from caramel.bench.hetero_prediction import Heterogeneity
    from caramel.bench.prediction import job_predictions
    from caramel.profile.model_profile import ModelProfile

    (path,) = RUN_S.glob("trace/*/prediction_inputs.json")
    d = json.loads(path.read_text())
    assert "model" not in d["profile"]["meta"][SHARING_KEY]
    recorded = {r["strategy"]: r["predicted_step_s"] for r in json.loads((RUN_S / "bench.json").read_text())["records"]}
    names = ["pipeline:replicas=auto,stages=auto", "pipeline:microbatches=2,partition=layer3,replicas=2"]
    out = job_predictions(ModelProfile.from_dict(d["profile"]), names, d["world"], d["grad_bytes"], d["comm_s"],
                          d["comm_buckets"], d["rank_compute_s"], d["spans"], d["probed"], d.get("traffic"),
                          Heterogeneity.from_dict(d.get("heterogeneity")))["predicted"]
    assert recorded[names[0]].hex() == "0x1.210437694ab94p-3"  # the record itself, as stored
    for name in names:
        assert out[name]["step_time_s"] == recorded[name], name
