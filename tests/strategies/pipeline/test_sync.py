"""Synchronous pipelines (torch's schedules under caramel.pipeline) against single-process training."""
from __future__ import annotations

from caramel.testing import run_workers
from tests.strategies.pipeline import workers

STEPS = 10


def test_sync_schedules_match_single_process():
    ranks = run_workers(workers.sync_worker, 2, args=(STEPS,), timeout_s=150)
    for out in ranks:
        for name in ("gpipe", "1f1b", "interleaved", "1f1b_auto_adam"):
            assert out[name]["diff"] <= 1e-5, (name, out[name])
            assert out[name]["losses"][-1] < out[name]["losses"][0], (name, out[name]["losses"])
        assert out["reloaded"] == 0.0
        assert out["bench"]["name"] == "pipeline:partition=5,schedule=gpipe" and out["bench"]["diff"] <= 1e-5
        # a model that is no nn.Sequential, cut by torch's tracer at a named module
        traced = out["traced"]
        assert traced["diff"] <= 1e-5, traced
        # its stages run torch's generated code, not the node-by-node fx interpreter (torch builds
        # the stages from modules with that switch; if it stops, this fix needs another look)
        assert traced["switchable"] and not any(on for _, on in traced["switchable"]), traced["switchable"]
        # partition="auto" there: a module name chosen by the partitioner, the same on every rank
        assert traced["auto_diff"] <= 1e-5 and len(traced["auto_boundaries"]) == 1, traced
        assert traced["auto_boundaries"][0].startswith("layers."), traced
        unknown, world, uneven = traced["errors"]
        assert "partition names ['layers.9']" in unknown, unknown
        assert "stages=3 x replicas=1 needs 3 workers, the group has 2" in world, world
        assert "must split into microbatches=4 equal parts" in uneven, uneven
        # the bench's pipeline handed the job's profile and cluster: cut where the simulator cuts,
        # between the MLP's ModuleList children, and trained exactly
        planned = out["planned"]
        assert planned["units"] and all(u.startswith("layers.") for u in planned["units"][1:-1]), planned
        assert planned["cut"] == planned["predicted"] and planned["diff"] <= 1e-5, planned
        assert planned["planned_at"] and planned["profile_handed"], planned
        # profiling in turns: the two ranks (one host) never ran at once, rank 0 first; the
        # bench's job profile in turns records both steps and the sharing it gives
        (a0, b0), (a1, b1) = planned["turns"]["spans"]
        assert b0 <= a1, planned["turns"]["spans"]
        assert len(set(planned["turns"]["hosts"])) == 1
        assert planned["turns"]["failed"] in ("ok", "rank 1's profile failed")
        sharing = planned["turns"]["sharing"]
        assert sharing["ranks_per_host"] == 2 and sharing["alone_speedup"] >= 1.0, sharing
        assert len(sharing["together_step_s"]) == len(sharing["alone_step_s"]) == 2, sharing
        assert planned["turns"]["alone_step_s"] in sharing["alone_step_s"] and not planned["turns"]["together_meta"]
        # ranks sharing a host: the runtime plans at the speeds the prediction settled at, cuts as it does
        shared = planned["shared"]
        assert shared["factor"] > 1.0 and shared["planned_at"]["speeds"] == [shared["factor"]] * 2, shared
        assert shared["planned_at"]["alone_speedup"] == 1.0 and shared["cut"] == shared["predicted"], shared
        old_cut, old_diff = planned["old_profile"]
        assert old_cut[0].startswith("layers.") and old_diff <= 1e-5, planned["old_profile"]
        # a tied weight split across stages: its gradient summed over the two holders, trained exactly,
        # the copies bit-identical, one tensor in the state dict; the bench runs such a pipeline
        tied = out["tied"]
        assert tied["diff"] <= 1e-5 and tied["copies_equal"] and tied["one_tensor"], tied
        assert tied["moved"] > 1e-3 and tied["bench"] == "ok", tied
        for name in ("sequential", "interleaved"):
            assert tied[name]["diff"] <= 1e-5 and tied[name]["copies_equal"], (name, tied[name])
        assert "schedule=pipedream cannot train a tied weight" in tied["pipedream"], tied["pipedream"]
        # an nn.Sequential with named children, cut from a profile: exact; its options rebuild the same cut
        for name in ("partition", "replicas"):
            named = out["named"][name]
            assert isinstance(named, dict) and named["diff"] <= 1e-5, (name, named)
            assert named["again"] == named["cut"] and not named["replanned"], (name, named)
            assert named["partition"] == "+".join(map(str, named["cut"])) and named["before"] == 0, (name, named)
        assert "planning failed on rank 0" in out["named"]["bad_profile"], out["named"]["bad_profile"]
    assert [r["planned"]["turns"]["failed"] for r in ranks] == ["ok", "rank 1's profile failed"]
    assert [r["planned"]["turns"]["job_failed"] for r in ranks] == [
        "RuntimeError: profiling in turns failed on rank 1: MemoryError: no room for rank 1's copy",
        "MemoryError: no room for rank 1's copy"]
    # a pipeline on a subgroup: the group's first rank computes the factor, the broadcast stays in it
    assert ranks[1]["planned"]["shared"]["in_group"] == [ranks[1]["planned"]["shared"]["factor"]] * 2
    assert ranks[0]["1f1b"]["losses"] == ranks[1]["1f1b"]["losses"]  # the loss is on every rank
    assert ranks[0]["1f1b_auto_adam"]["boundaries"] == ranks[1]["1f1b_auto_adam"]["boundaries"]
    assert ranks[0]["traced"]["auto_boundaries"] == ranks[1]["traced"]["auto_boundaries"]


def test_registered_with_typed_options_and_a_clear_redirect():
    import pytest
    import torch

    import caramel
    from caramel.errors import CaramelError
    from caramel.strategies import STRATEGIES

    spec = STRATEGIES.spec("pipeline:stages=3,partition=2+4,schedule=pipedream,vertical_sync=true")
    assert spec.options.boundaries() == [2, 4] and spec.name.startswith("pipeline:")
    with pytest.raises(CaramelError, match="did you mean 'stages'"):
        STRATEGIES.spec("pipeline:stagse=2")
    model = workers.make_model()
    with pytest.raises(CaramelError, match=r"use caramel.pipeline\(model, optimizer"):
        caramel.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), "pipeline")
