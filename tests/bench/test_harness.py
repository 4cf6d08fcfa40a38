"""The harness's round order (one process)."""
from caramel.bench.harness import round_order


def test_rounds_rotate_so_every_runner_leads_once_and_keeps_its_neighbours():
    keys = ["ddp", "caramel", "compute"]
    orders = [round_order(keys, r) for r in range(4)]
    assert orders == [["ddp", "caramel", "compute"], ["caramel", "compute", "ddp"],
                      ["compute", "ddp", "caramel"], ["ddp", "caramel", "compute"]]
    assert keys == ["ddp", "caramel", "compute"]  # not reordered in place
