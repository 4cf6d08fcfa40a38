"""Branch order is exact: two_tower trained with its towers reordered (`branch_order="auto"`)
ends with DDP's parameters, on 2 workers over gloo."""
import pytest

from caramel.testing import run_workers
from tests.distributed.branch_workers import branch_order_worker

TOL = 1e-5
STEPS = 8  # planned from a given profile: every step reordered


@pytest.mark.timeout(360)
def test_reordered_towers_match_ddp():
    results = run_workers(branch_order_worker, 2, args=(STEPS,), timeout_s=300)
    for rank, res in enumerate(results):
        assert res["module_order"] is not None, f"rank {rank}: the planner kept the identity: {res['decision']}"
        assert res["module_order"][0].startswith("deep"), res["module_order"]  # the conv tower first
        assert res["running"] == {0: (1, 0)}, f"rank {rank}: the reordered forward is not installed"
        assert res["state_dict_keys"]
        assert res["order_changes"] == 0 and res["replans"] == 0, res
        assert res["diff"] <= TOL, f"rank {rank}: parameters differ from DDP's by {res['diff']:g} (> {TOL})"
    assert results[0]["module_order"] == results[1]["module_order"]
