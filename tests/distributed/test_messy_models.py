"""Real models are messy: each case trains with Caramel and DDP side by side (2 workers) and
must end with the same parameters (max abs difference <= 1e-5)."""
import pytest

from caramel.testing import run_workers
from tests.distributed.messy_workers import CASES, all_cases_worker, mismatch_cases_worker

TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    return run_workers(all_cases_worker, 2, timeout_s=400)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("case", sorted(CASES))
def test_case_matches_ddp(results, case):
    for rank, res in enumerate(results):
        value = res[case]
        assert not isinstance(value, str), f"rank {rank} failed: {value}"
        assert value <= TOL, f"rank {rank}: {case} differs from DDP by {value:g}"


MISMATCHES = [("shape", "shape"), ("count", "parameters"),
              ("option", "different overlap to parallelize: rank 0: 'auto', rank 1: 'backward'"),
              ("plan", "rank 1: plan: plan was made for 3 workers, this job has 2"),
              ("plan_file", "rank 1: /nonexistent/caramel-plan.json: no such file"),
              ("cluster", "ranks passed different clusters to parallelize: rank 0: None")]


@pytest.fixture(scope="module")
def mismatches():
    """Every mismatch case in turn, in one 2-worker job."""
    return run_workers(mismatch_cases_worker, 2, args=([what for what, _ in MISMATCHES],), timeout_s=200)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("what,expected", MISMATCHES)
def test_models_that_differ_across_ranks_fail_clearly(mismatches, what, expected):
    for rank, msg in enumerate(m[what] for m in mismatches):
        assert msg != "no error", f"rank {rank} accepted a model that differs from rank 0's"
        assert expected in msg and "rank 1" in msg, msg
