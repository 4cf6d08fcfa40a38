"""Unequal replica counts per stage (`replicas="2+1"`): virtual pipelines against single-process training."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.testing import run_workers
from tests.strategies.pipeline import unequal_workers
from tests.train import unequal_resume

# name: (replicas, schedule, optimizer, microbatches, batch)
THREE = {"2+1_gpipe_sgd": ("2+1", "gpipe", "sgd", 4, 8), "1+2_1f1b_adam": ([1, 2], "1f1b", "adam", 4, 8),
         "2+1_1f1b_auto": ("2+1", "1f1b", "sgd", "auto", 8)}


@pytest.mark.timeout(420)  # two spawns of 3 processes; each bounded by its own limit
def test_unequal_replicas_match_whole_batch_training_on_3_workers(tmp_path):
    ranks = run_workers(unequal_workers.unequal_worker, 3, args=(THREE, unequal_workers.STEPS, str(tmp_path)),
                        timeout_s=220)
    assert [(r["2+1_gpipe_sgd"]["stage"], r["2+1_gpipe_sgd"]["replica"]) for r in ranks] == [(0, 0), (0, 1), (1, 0)]
    assert [r["2+1_gpipe_sgd"]["virtual"] for r in ranks] == [[0], [1], [0, 1]]
    assert [r["1+2_1f1b_adam"]["virtual"] for r in ranks] == [[0, 1], [0], [1]]
    for out in ranks:
        for name, r in ((n, out[n]) for n in THREE):
            assert r["diff"] <= 1e-5, (name, r["diff"])
            assert r["half_diff"] > 1e-3, (name, r["half_diff"])  # the comparison can fail
            assert abs(r["losses"][0] - r["first_loss"]) <= 1e-5, (name, r["losses"][0], r["first_loss"])
    for name in THREE:
        assert len({tuple(r[name]["losses"]) for r in ranks}) == 1  # the loss is on every rank
    # rank-dependent seeds (the first config): stage 0's replicas end with one set of weights, and
    # the job trains the model of each stage's first rank (failed before the construction broadcast)
    assert ranks[0]["2+1_gpipe_sgd"]["own"] == ranks[1]["2+1_gpipe_sgd"]["own"]
    for r in ranks:  # another batch on rank 1: one error on every rank, before the schedule runs
        assert "every rank must pass the same batch" in r["batch_error"] and "rank(s) [1]" in r["batch_error"]
        assert "replicas=2+1 (unequal counts) cannot train a tied weight" in (r["tied_error"] or ""), r["tied_error"]
        for name in THREE:
            assert_closed(r[name]["close"])
    # "auto": one count for all ranks, a multiple of the 2 virtual pipelines with 2 microbatches each
    # (1F1B's bound per pipeline), among those that split the batch of 8
    auto = {(r["2+1_1f1b_auto"]["microbatches"], tuple(r["2+1_1f1b_auto"]["boundaries"])) for r in ranks}
    assert len(auto) == 1 and next(iter(auto))[0] in (4, 8), auto
    # caramel train on 2+1: 6 steps straight against 3, stop, and 3 more resumed in fresh
    # processes give the same parameters, optimizer state, LR schedule and losses, bit for bit
    resumed = run_workers(unequal_resume.resume_worker, 3, args=(str(tmp_path),), timeout_s=160)
    unequal_resume.check(tmp_path, [r["train"] for r in ranks], resumed)


def test_unequal_replicas_on_4_workers():
    # three virtual pipelines (3+1, 1+3), and three stages with a replicated middle one
    configs = {"3+1_gpipe_sgd": ("3+1", "gpipe", "sgd", 6, 12), "1+3_1f1b_adam": ("1+3", "1f1b", "adam", 6, 12),
               "1+2+1_gpipe_sgd": ("1+2+1", "gpipe", "sgd", 4, 8)}
    ranks = run_workers(unequal_workers.unequal_worker, 4, args=(configs,), timeout_s=150)
    assert [r["3+1_gpipe_sgd"]["virtual"] for r in ranks] == [[0], [1], [2], [0, 1, 2]]
    assert [r["1+3_1f1b_adam"]["virtual"] for r in ranks] == [[0, 1, 2], [0], [1], [2]]
    assert [r["1+2+1_gpipe_sgd"]["stage"] for r in ranks] == [0, 1, 1, 2]
    for out in ranks:
        for name in configs:
            r = out[name]
            assert r["diff"] <= 1e-5 and r["half_diff"] > 1e-3, (name, r["diff"], r["half_diff"])
        assert "replicas=2+1 needs 3 workers (their sum), the group has 4" in out["world_error"], out["world_error"]
        for close in [out[name]["close"] for name in configs] + [out["equal_close"]]:  # equal: caramel.shutdown()
            assert_closed(close)
    assert ranks[0]["3+1_gpipe_sgd"]["own"] == ranks[2]["3+1_gpipe_sgd"]["own"]  # built from seeds 0 and 2
    # replicas="auto": every rank took rank 0's choice and trained the whole batch exactly; the
    # compute-heavy front got 3 of the 4 workers (3+1), and where only
    # 2+2 divides the microbatches, two pipelines of 2 microbatches each
    for name, counts, options in (("3+1", [3, 1], (2, "3+1", 6)), ("2x2", [2, 2], (2, 2, 2))):
        auto = [r["auto"][name] for r in ranks]
        assert len({(tuple(a["boundaries"]), tuple(a["losses"])) for a in auto}) == 1, auto
        for a in auto:
            assert a["counts"] == a["partition_replicas"] == counts and a["options"] == options, a
            assert a["diff"] <= 1e-5 and a["half_diff"] > 1e-3, (name, a["diff"], a["half_diff"])


def assert_closed(close: dict) -> None:
    """The pipeline's constructor made >= 2 groups (its virtual pipelines, or a hybrid's pipeline and
    replica groups), all recorded to destroy; none is left after close(); a later step is an error."""
    assert close["made"] == close["created"] >= 2 and close["left"] == 0, close
    assert "closed" in close["error"], close


def test_unequal_replica_options_are_typed_and_checked():
    from caramel.strategies import STRATEGIES
    from caramel.strategies.options import to_spec
    from caramel.strategies.pipeline.options import PipelineOptions

    spec = STRATEGIES.spec("pipeline:replicas=2+1,schedule=gpipe,microbatches=4")
    assert spec.options.replica_counts() == (2, 1) and spec.options.unequal_replicas
    assert spec.options.replica_period == 2 and spec.options.workers() == 3
    assert to_spec("pipeline", spec.options) == spec.name  # prints the way it parses
    assert PipelineOptions(replicas=[2, 1]).replicas == "2+1"
    assert PipelineOptions(replicas=[2, 2]).replicas == 2  # equal counts: the equal-replica runtime
    assert PipelineOptions(stages=3, replicas=(3, 1, 2)).replica_period == 6
    bad = {
        "gives 3 counts; stages=2 needs one per stage": dict(replicas=[2, 1, 1]),
        "every stage needs >= 1 replica": dict(replicas="2+0"),
        "one count per stage like '2\\+1', got 'a\\+1'": dict(replicas="a+1"),
        "runs with schedule gpipe or 1f1b, not 'pipedream'": dict(replicas="2+1", schedule="pipedream"),
        "microbatches must be a multiple of 6": dict(stages=2, replicas="3+2", microbatches=4),
        "leave replica_reduce=auto, not 'caramel'": dict(replicas="2+1", replica_reduce="caramel"),
        "each of the 2 virtual pipelines needs >= stages \\(2\\) microbatches": dict(replicas="2+1", microbatches=2),
    }
    for message, kwargs in bad.items():
        with pytest.raises(CaramelError, match=message):
            PipelineOptions(**kwargs)
    with pytest.raises(CaramelError, match="replicas=3\\+4\\+5 runs lcm = 60 virtual pipelines.*at most 16"):
        PipelineOptions(stages=3, replicas="3+4+5", microbatches=60)
    assert PipelineOptions(stages=2, replicas="16+1", schedule="gpipe", microbatches=16).replica_period == 16  # the limit itself runs
    with pytest.raises(CaramelError, match="option replicas must be"):
        STRATEGIES.spec("pipeline:replicas=1.5")
