"""Ranks that disagree must all stop with an error that names what differs, never hang, never
finish silently with different parameters."""
import pytest

from experiments.faults.disagree import disagreement_experiment
from experiments.faults.result import MatrixConfig

CFG = MatrixConfig(timeout_s=10.0)


def _all_failed_naming(raw, *words):
    assert raw["hung"] == [], f"ranks {raw['hung']} hung"
    assert all(c not in (0, None) for c in raw["exit_codes"]), raw["exit_codes"]
    for rank, msg in raw["messages"].items():
        for w in words:
            assert w in msg, f"rank {rank}: {msg!r} does not name {w!r}"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("variant,words", [("wide", ["MismatchError", "rank 1", "shape"]),
                                           ("deep", ["MismatchError", "rank 1", "parameters"])])
def test_different_models_raise_mismatch_on_every_rank(variant, words):
    raw = disagreement_experiment(CFG, rank_args={1: ["--model-variant", variant]})
    _all_failed_naming(raw, *words)
    assert raw["checksums"] == {}


@pytest.mark.timeout(150)
def test_different_plans_raise_mismatch_on_every_rank():
    raw = disagreement_experiment(CFG, rank_args={0: ["--plan-bucket-kb", "1"], 1: ["--plan-bucket-kb", "1000"]})
    _all_failed_naming(raw, "MismatchError", "different plans", "rank 0:", "rank 1:")


@pytest.mark.timeout(150)
def test_different_world_sizes_fail_on_every_rank_naming_the_world_size():
    raw = disagreement_experiment(CFG, rank_env={1: {"WORLD_SIZE": "3"}})
    _all_failed_naming(raw, "world size")


@pytest.mark.timeout(150)
def test_a_collective_skipped_on_one_rank_is_reported_on_every_rank():
    raw = disagreement_experiment(CFG, rank_args={1: ["--skip-step", "7"]}, extra_args=["--check-every", "5"])
    _all_failed_naming(raw, "step")


@pytest.mark.timeout(150)
def test_agreeing_ranks_finish_with_identical_parameters():
    # the control: the same job without a disagreement succeeds, so the failures above are the fault's
    raw = disagreement_experiment(CFG)
    assert raw["exit_codes"] == [0, 0] and len(raw["checksums"]) == 2
    assert len(set(raw["checksums"].values())) == 1
