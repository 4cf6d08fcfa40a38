"""The ps strategy's options (bad input is one clear error), placement and the plan's data."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.placement import imbalance, place, shard_loads
from caramel.strategies.ps.planner import PsPlan, make_ps_plan


def test_spec_parses_and_defaults():
    spec = STRATEGIES.spec("ps:order=tic,consistency=ssp_2,servers=1")
    assert (spec.options.order, spec.options.staleness_bound(), spec.options.servers) == ("tic", 2, 1)
    assert STRATEGIES.spec("ps").options.staleness_bound() == 0
    assert STRATEGIES.spec("ps", {"consistency": "ssp:3"}).options.staleness_bound() == 3
    assert STRATEGIES.spec("ps:consistency=asp").options.staleness_bound() is None


@pytest.mark.parametrize("text, message", [
    ("ps:order=lifo", "order must be one of tac, tic, fifo, random"),
    ("ps:consistency=ssp_-1", "S must be >= 0"),
    ("ps:consistency=ssp_x", "consistency must be 'bsp', 'ssp:S'"),
    ("ps:consistency=bulk", "consistency must be 'bsp', 'ssp:S'"),
    ("ps:servers=-1", "servers must be >= 0"),
    ("ps:placement=hash", "placement must be one of balanced, bytes, roundrobin"),
    ("ps:ordr=tac", "did you mean 'order'"),
])
def test_bad_input_is_one_clear_error(text, message):
    with pytest.raises(CaramelError, match=message):
        STRATEGIES.spec(text)


def test_more_servers_than_ranks_is_an_error(monkeypatch):
    opts = PsOptions(servers=3)
    assert opts.check_world(4) == 3 and PsOptions().check_world(4) == 4
    with pytest.raises(CaramelError, match="servers=3 but the job has only 2 ranks"):
        opts.check_world(2)
    assert PsOptions(hierarchical=True).check_world(4, local_size=2) == 2  # one server per node
    with pytest.raises(CaramelError, match="servers=3 but the job has only 2 nodes"):
        PsOptions(hierarchical=True, servers=3).check_world(4, local_size=2)
    from caramel.strategies.ps.hierarchy import local_world_size
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(CaramelError, match="needs LOCAL_WORLD_SIZE"):
        local_world_size(4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(CaramelError, match="whole nodes"):
        local_world_size(4)


def test_balanced_placement_spreads_the_first_needed_parameters():
    """Two big first-needed parameters, then small ones: round-robin by index puts both big
    ones on shard 0 (every worker waits on one server at the start of the forward); balanced
    placement puts one on each, and evens the bytes."""
    sizes = [800, 100, 800, 100, 100, 100]
    need = [0, 2, 1, 3, 4, 5]
    rr = place(sizes, need, 2, "roundrobin")
    bal = place(sizes, need, 2, "balanced")
    assert rr == [0, 1, 0, 1, 0, 1]
    assert bal[0] != bal[2]
    rr_load, bal_load = shard_loads(sizes, need, rr, 2), shard_loads(sizes, need, bal, 2)
    assert [x.bytes for x in rr_load] == [1700, 300]
    assert imbalance(bal_load)["bytes_max_over_mean"] < imbalance(rr_load)["bytes_max_over_mean"]
    assert imbalance(bal_load)["bytes_max_over_mean"] == pytest.approx(1.0)
    by_bytes = place(sizes, need, 2, "bytes")
    assert sum(sizes[k] for k in range(6) if by_bytes[k] == 0) == 1000
    with pytest.raises(CaramelError, match="permutation"):
        place(sizes, [0, 1], 2, "balanced")


def test_plan_orders_owners_and_round_trip():
    prof = synthetic_profile(sizes_bytes=[4000, 1000, 2000, 3000], forward_time_s=0.01)
    plan = make_ps_plan(prof, PsOptions(bucket_cap_mb=0), shards=2, latency_s=1e-4, bandwidth_Bps=1e6)
    assert plan.pull_order == [0, 1, 2, 3]  # a chain: first needed first
    assert plan.push_order == [3, 2, 1, 0]  # backward produces the last layer's gradient first
    assert sorted(set(plan.owner.values())) == [0, 1]
    assert plan.predicted["tac"]["E"] >= plan.predicted["fifo"]["E"]
    assert plan.predicted["tac"]["makespan_s"] <= plan.predicted["random"]["makespan_s"]
    assert PsPlan.from_dict(plan.to_dict()) == plan
    rnd = make_ps_plan(prof, PsOptions(order="random", seed=3, bucket_cap_mb=0), shards=2, latency_s=1e-4, bandwidth_Bps=1e6)
    orders = {tuple(rnd.pull_order_at(u)) for u in range(20)}
    assert len(orders) > 5 and all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert rnd.pull_order_at(4) == rnd.pull_order_at(4)


def test_balanced_placement_beats_round_robin_on_resnet50():
    """Shard loads reported by the plan: balanced evens both the bytes and the first-needed bytes."""
    from caramel.sim.synthetic import resnet50_profile

    prof = resnet50_profile()
    loads = {mode: make_ps_plan(prof, PsOptions(placement=mode), shards=4, bandwidth_Bps=1.25e8).predicted["shard_imbalance"]
             for mode in ("balanced", "roundrobin", "bytes")}
    assert loads["balanced"]["bytes_max_over_mean"] < 1.05 < loads["roundrobin"]["bytes_max_over_mean"]
    assert loads["balanced"]["early_bytes_max_over_mean"] < loads["roundrobin"]["early_bytes_max_over_mean"]
    assert loads["balanced"]["early_bytes_max_over_mean"] <= loads["bytes"]["early_bytes_max_over_mean"]


def test_optimizers_the_servers_cannot_split_are_refused_before_any_setup():
    import torch

    import caramel

    model = torch.nn.Linear(2, 2)
    with pytest.raises(CaramelError, match="got LBFGS"):
        caramel.parallelize(model, torch.optim.LBFGS(model.parameters()), "ps")
    with pytest.raises(CaramelError, match="not the model's"):
        caramel.parallelize(model, torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), "ps")


def test_a_hierarchy_names_its_node_count():
    """`Hierarchy.nodes` sets how many node sums a server leader waits for: no default that
    would leave a server waiting for none."""
    from caramel.strategies.ps.hierarchy import Hierarchy
    with pytest.raises(TypeError, match="nodes"):
        Hierarchy(2, 0, None, None, [], [])
    assert Hierarchy(2, 0, None, None, [], [], nodes=3).leaders() == [0, 2, 4]
