"""Buffer broadcast (`caramel.runtime.buffer_sync`): rank 0's buffers before each forward as DDP,
sent as the training forward before ends (the default) or as each forward starts."""
import pytest

from caramel.testing import run_workers
from tests.distributed.workers import buffer_change_worker

TOL = 1e-5
STEPS = 8


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [True, "forward"])
def test_buffers_changed_between_steps_on_every_rank_match_ddp(mode):
    # a reset of the statistics on every rank mid-run, and eval forwards (which read them) on
    # every rank: parameters, buffers and eval outputs as DDP's on every rank
    for rank, res in enumerate(run_workers(buffer_change_worker, 2, args=(mode, "all", STEPS), timeout_s=160)):
        assert res["error"] is None, f"rank {rank}: {res['error']}"
        assert res["diff"] <= TOL and res["eval_diff"] <= TOL, f"rank {rank}: {res}"
        assert res["buffers_equal"], f"rank {rank}: integer buffers (num_batches_tracked) differ from DDP's"


@pytest.mark.timeout(180)
def test_buffers_changed_on_rank_zero_only_is_an_error_not_a_silent_shift():
    # rank 0 alone resets its statistics: it broadcasts them at the next forward's start, while
    # rank 1 already took the broadcast sent as the previous forward ended; the marker in the
    # payload turns that into an error that names the cause and the way out
    results = run_workers(buffer_change_worker, 2, args=(True, "rank0", STEPS), timeout_s=160)
    errors = [r["error"] for r in results]
    assert any(e and "broadcast_buffers='forward'" in e and "some ranks but not on others" in e for e in errors), errors


@pytest.mark.timeout(180)
def test_forward_mode_takes_rank_zero_only_changes_as_ddp():
    for rank, res in enumerate(run_workers(buffer_change_worker, 2, args=("forward", "rank0", STEPS), timeout_s=160)):
        assert res["error"] is None, f"rank {rank}: {res['error']}"
        assert res["diff"] <= TOL and res["eval_diff"] <= TOL and res["buffers_equal"], f"rank {rank}: {res}"
