"""Hybrid pipelines (2 stages x 2 replicas): the replicas' gradients averaged by DDP or Caramel's engine."""
from __future__ import annotations

import math

import pytest

from caramel.errors import CaramelError
from caramel.testing import run_workers
from tests.strategies.pipeline import hybrid_workers


def test_hybrid_replicas_match_whole_batch_training_with_ddp_and_caramel(tmp_path):
    ranks = run_workers(hybrid_workers.hybrid_worker, 4, args=(hybrid_workers.STEPS, str(tmp_path)), timeout_s=280)
    assert [r["caramel_1f1b_adam"]["layout"] for r in ranks] == [(0,), (0,), (1,), (1,)]
    for out in ranks:
        for name in ("ddp_1f1b_sgd", "caramel_gpipe_sgd", "caramel_1f1b_adam"):
            r = out[name]
            assert r["diff"] <= 1e-5 and r["mid_diff"] <= 1e-5, (name, r)
            assert r["moved"] > 1e-4 and r["alone_diff"] > 1e-3, (name, r)  # the comparison can fail
        assert not out["ddp_1f1b_sgd"]["pending_after_step"]
        # a tied weight split across the stages, with replicas: summed over its holders after DDP's average
        tied = out["tied"]
        assert tied["diff"] <= 1e-5 and tied["copies_equal"] and tied["ddp"], tied
        assert "replica_reduce='caramel' defers each update" in tied["caramel"], tied["caramel"]
        for name in ("caramel_gpipe_sgd", "caramel_1f1b_adam"):
            r = out[name]
            # the engine ran every step on the replica group, its last update deferred
            assert r["world"] == 2 and r["steps"] == hybrid_workers.STEPS and r["planner"] == "caramel", (name, r)
            assert r["pending_after_step"] and r["buckets"] >= 1, (name, r)
            # the trace keeps the engine's bucket plan and, each step, its collectives in that
            # order, every one issued inside the step's last backward and done after its issue
            trace = r["reduces"]
            plan_bytes = [b for _, _, b in trace["plan"]]
            assert len(trace["plan"]) >= 1 and sum(plan_bytes) >= trace["params_bytes"] > 0, trace
            assert len(trace["steps"]) == hybrid_workers.STEPS - 1, trace
            for st in trace["steps"]:
                assert st["bytes"] == plan_bytes, (name, st, plan_bytes)
                assert all(st["issued_in_last_backward"]) and all(st["done_after_issue"]), (name, st)
    # BatchNorm statistics: each stage's replicas end with the first replica's (they saw other
    # batches), and they moved from their initial values
    bn = [r["batchnorm"] for r in ranks]
    assert bn[0] == bn[1] and bn[2] == bn[3] and set(bn[0]) != set(bn[2]), bn
    # torch's first-step shape inference runs a forward on uninitialized inputs in the second
    # stage; it must leave no trace: finite statistics, exactly the microbatches trained
    assert bn[0]["1.running_mean"] != [0.0] * 32
    for r in bn:
        assert all(math.isfinite(x) for k, v in r.items() if "running" in k for x in v), r
        assert all(v == 3 * hybrid_workers.MICRO for k, v in r.items() if k.endswith("num_batches_tracked")), r
    # caramel train on it: stop after 3 steps and resume for 3 gives the 6 straight steps' model,
    # optimizer state (both stages' merged) and losses, bit for bit (the engine's updates are
    # lazy: the checkpoint must apply the last step's)
    run = ranks[0]["train"]
    assert run["start_step"] == 3 and run["optimizer_keys"] > 0 and run["differ"] == [], run
    assert run["losses"]["straight"] == run["losses"]["resumed"] and len(run["losses"]["straight"]) == 6, run


def test_replica_reduce_option_is_typed_and_checked():
    from caramel.strategies import STRATEGIES
    from caramel.strategies.pipeline.options import PipelineOptions

    spec = STRATEGIES.spec("pipeline:stages=2,replicas=2,replica_reduce=caramel")
    assert spec.options.replica_reduce == "caramel"
    # "auto" (the default): Caramel's engine where it runs, DDP with interleaved
    assert STRATEGIES.spec("pipeline:replicas=2").options.replica_reducer() == "caramel"
    assert STRATEGIES.spec("pipeline:replicas=2,schedule=gpipe").options.replica_reducer() == "caramel"
    interleaved = STRATEGIES.spec("pipeline:stages=4,replicas=2,schedule=interleaved").options
    assert interleaved.replica_reduce == "auto" and interleaved.replica_reducer() == "ddp"
    assert STRATEGIES.spec("pipeline:replicas=2,replica_reduce=ddp").options.replica_reducer() == "ddp"
    with pytest.raises(CaramelError, match="replica_reduce must be one of auto, caramel, ddp, got 'nccl'"):
        STRATEGIES.spec("pipeline:replicas=2,replica_reduce=nccl")
    with pytest.raises(CaramelError, match="replica_reduce must be one of auto, caramel, ddp"):
        PipelineOptions(replica_reduce="gossip")
    with pytest.raises(CaramelError,
                       match="replica_reduce=caramel runs with schedule gpipe or 1f1b, not 'interleaved'"):
        PipelineOptions(stages=4, replicas=2, schedule="interleaved", replica_reduce="caramel")
