"""The harness's round order (one process)."""
from caramel.bench.baselines import Runner
from caramel.bench.harness import round_order


def test_rounds_rotate_so_every_runner_leads_once_and_keeps_its_neighbours():
    keys = ["ddp", "caramel", "compute"]
    orders = [round_order(keys, r) for r in range(4)]
    assert orders == [["ddp", "caramel", "compute"], ["caramel", "compute", "ddp"],
                      ["compute", "ddp", "caramel"], ["ddp", "caramel", "compute"]]
    assert keys == ["ddp", "caramel", "compute"]  # not reordered in place


class _Runner(Runner):
    """Settles after `settle_at` steps; counts them."""

    def __init__(self, settle_at: int):
        self.settle_at, self.steps, self.finished = settle_at, 0, False

    def step(self) -> None:
        self.steps += 1

    def settled(self) -> bool:
        return self.steps >= self.settle_at

    def finish(self) -> None:
        self.finished = True


def _settle_worker(rank: int, world: int, disagree: bool) -> dict:
    import torch.distributed as dist

    from caramel.bench import harness
    from caramel.errors import CaramelError

    calls = []
    real = dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    try:
        runner = _Runner(5 + (rank if disagree else 0))
        try:
            steps = harness.settle(runner, "caramel", max_steps=20)
        except CaramelError as e:
            return {"error": str(e)}
        return {"steps": steps, "runner_steps": runner.steps, "finished": runner.finished, "collectives": len(calls)}
    finally:
        dist.all_reduce = real


def test_settling_runs_no_collective_per_step_and_checks_that_ranks_agree():
    from caramel.testing import run_workers

    for res in run_workers(_settle_worker, 2, args=(False,), timeout_s=60):
        assert res == {"steps": 5, "runner_steps": 5, "finished": True, "collectives": 1}
    for rank, res in enumerate(run_workers(_settle_worker, 2, args=(True,), timeout_s=60)):
        assert "settled after" in res["error"] and "5 to 6" in res["error"], res
