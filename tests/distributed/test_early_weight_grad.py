"""Early weight gradients are exact: the tied transformer's output layer, whose gradient fills the
plan's first collective, computes it before its input gradient, and the parameters still equal
DDP's after the profiling steps and several planned ones."""
import pytest

from caramel.testing import run_workers
from tests.distributed.early_workers import early_weight_grad_worker

TOL = 1e-5
STEPS = 12  # the online profile takes 4, the plan runs the rest
PROFILE_STEPS = 4


@pytest.mark.timeout(300)
def test_early_weight_gradient_of_the_tied_output_layer_matches_ddp():
    results = run_workers(early_weight_grad_worker, 2, args=(STEPS,), timeout_s=280)
    for rank, res in enumerate(results):
        assert "tok.weight" in res[(True, "first bucket")], res
        assert "head" in res[(True, "early")], f"rank {rank}: {res}"
        assert sorted(res[(True, "early")]) == res[(True, "eligible")], f"rank {rank}: {res}"
        assert res[(False, "early")] == [], f"rank {rank}: {res}"
        # the early path ran: once the plan is in force, every step hands its early layers over
        handed = res[(True, "handed")]
        assert sum(n >= len(res[(True, "early")]) for n in handed) >= STEPS - PROFILE_STEPS, handed
        assert all(n >= 1 for n in handed[handed.index(next(n for n in handed if n)):]), handed
        assert res[(False, "handed")] == [0] * STEPS, res[(False, "handed")]
        for early in (True, False):
            assert res[(early, "diff")] <= TOL, f"rank {rank}: early={early}: differs by {res[(early, 'diff')]:g}"
