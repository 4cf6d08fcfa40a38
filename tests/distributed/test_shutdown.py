"""caramel.shutdown(): pending updates applied, private groups released, later use a clear error."""
import pytest

from caramel.testing import run_workers
from tests.distributed.workers import shutdown_worker


@pytest.mark.timeout(120)
def test_shutdown_applies_pending_updates_then_refuses_further_steps():
    results = run_workers(shutdown_worker, 2, args=(8,), timeout_s=100)
    for rank, res in enumerate(results):
        assert res["pending_before"], "forward overlap leaves the last step's updates pending"
        assert res["diff"] <= 1e-5, f"rank {rank}: {res['diff']}"
        assert res["comm_released"]
        assert res["error"] and "caramel.shutdown()" in res["error"], res["error"]
