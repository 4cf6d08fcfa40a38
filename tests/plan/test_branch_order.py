"""Branch order, offline: the reordered profile, the arrival order, and the planner's choice (`caramel.plan.branch_order`)."""
import pytest

from caramel.errors import CaramelError
from caramel.plan.branch_order import arrival_order, identity_order, order_for, profile_blocks, reordered_profile
from caramel.plan.plan import Plan
from caramel.sim.simulate import simulate
from caramel.sim.synthetic import _chain_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.caramel.branch_choice import choose_branch_order
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec

WIDE = [("emb", "Embedding", 16_000_000, 2.0 * 64 * 256), ("emb.proj", "Linear", 262_144, 2.0 * 64 * 256 * 256)]
DEEP = [("c1", "Conv2d", 6_912, 2.0 * 64 * 27 * 1024), ("c2", "Conv2d", 294_912, 2.0 * 128 * 576 * 256),
        ("c3", "Conv2d", 1_179_648, 2.0 * 256 * 1152 * 64)]
HEAD = [("head", "Linear", 20_480, 2.0 * 512 * 10)]


def towers(first=WIDE, second=DEEP, compute_s=0.1):
    """A two-tower profile (compute split by FLOPs), its blocks in meta as the tracer gives them."""
    layers = first + second + HEAD
    prof = _chain_profile("towers", [(n, t, [(f"{n}.weight", b)]) for n, t, b, _ in layers], [f for *_, f in layers],
                          compute_s / 3, 2 * compute_s / 3, 0.0, "float32")
    prof.meta["branches"] = [{"branches": [[n for n, *_ in first], [n for n, *_ in second]], "fixed": None}]
    return prof


def cluster_for(prof, ratio, workers=2):
    # comm/compute = ratio for a ring all-reduce of every gradient
    bw = 8 * prof.total_grad_bytes() * 2 * (workers - 1) / workers / (ratio * prof.compute_time_s)
    return ClusterSpec.uniform(workers, bw, 50e-6)


def test_identity_is_the_measured_chain_and_a_fixed_point():
    prof = towers()
    ident = reordered_profile(prof, identity_order(prof))
    for a, b in zip(prof.params, ident.params):
        assert a.ready_time_s == pytest.approx(b.ready_time_s, abs=1e-12)
        assert a.first_use_time_s == pytest.approx(b.first_use_time_s, abs=1e-12)
    again = reordered_profile(ident, identity_order(ident))
    assert [p.ready_time_s for p in again.params] == [p.ready_time_s for p in ident.params]


def test_reversed_towers_move_forward_and_backward():
    prof = towers()
    assert [(b.lo, b.hi) for b in profile_blocks(prof)] == [(0, 4)]
    order = order_for(prof, {0: (1, 0)})
    assert order == ["c1", "c2", "c3", "emb", "emb.proj", "head"]
    new = reordered_profile(prof, order)
    assert [m.name for m in new.modules] == order
    fwd = {m.name: m.forward_time_s for m in prof.modules}
    by = {p.name: p for p in new.params}
    assert by["c1.weight"].first_use_time_s == 0.0
    assert by["emb.weight"].first_use_time_s == pytest.approx(fwd["c1"] + fwd["c2"] + fwd["c3"])
    assert by["head.weight"].first_use_time_s == prof.params[-1].first_use_time_s  # after the block: unchanged
    bwd = {m.name: m.backward_time_s for m in prof.modules}
    t0 = prof.params[0].ready_time_s - sum(bwd[n] for n in order[:5])  # the span ends when it did
    assert by["emb.proj.weight"].ready_time_s == pytest.approx(t0 + bwd["emb.proj"])
    assert by["emb.weight"].ready_time_s == pytest.approx(t0 + bwd["emb.proj"] + bwd["emb"])
    assert by["c1.weight"].ready_time_s == pytest.approx(prof.params[0].ready_time_s)  # now the last in backward
    assert by["head.weight"].ready_time_s == prof.params[-1].ready_time_s
    assert [new.params[i].name for i in sorted(range(6), key=lambda i: new.params[i].ready_order)] == \
        ["head.weight", "emb.proj.weight", "emb.weight", "c3.weight", "c2.weight", "c1.weight"]
    again = reordered_profile(new, order)  # idempotent
    assert [p.ready_time_s for p in again.params] == pytest.approx([p.ready_time_s for p in new.params], abs=1e-12)


def test_arrival_order_runs_small_early_gradients_first():
    prof = towers()
    per_byte = 1 / cluster_for(prof, 1.0).bandwidth_bps * 8
    assert arrival_order(prof, per_byte) == {0: (1, 0)}  # the conv tower: ready earlier, 16 MB less
    assert arrival_order(towers(DEEP, WIDE), per_byte) == {0: (0, 1)}  # already first: the identity


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.0])
def test_planner_reorders_two_towers_and_never_picks_a_loser(ratio):
    for prof, expect in ((towers(), ["c1", "c2", "c3", "emb", "emb.proj", "head"]), (towers(DEEP, WIDE), None)):
        cluster = cluster_for(prof, ratio)
        off = make_plan("caramel", prof, cluster, world_size=2, compute_schedule="off", input_spread=0)
        auto = make_plan("caramel", prof, cluster, world_size=2, compute_schedule="off", input_spread=0,
                         branch_order="auto")
        assert auto.module_order == expect
        t_off = simulate(prof, cluster, off, trace=False).step_time_s
        t_auto = simulate(prof, cluster, auto, trace=False).step_time_s  # the plan's order applied to the measured profile
        assert t_auto == pytest.approx(auto.predicted_step_time_s)
        assert t_auto <= t_off * (1 + 1e-9)
        decision = auto.options["branch_order"]
        if expect is None:
            assert auto.fingerprint == off.fingerprint
        else:
            assert t_auto < 0.9 * t_off, (t_auto, t_off)  # the study's two towers: 25-46% faster simulated
            assert decision["candidate_s"] < decision["identity_s"]


def test_identity_stays_unless_the_candidate_wins_by_the_margin():
    prof = towers()
    calls = []

    def search(p):
        calls.append([m.name for m in p.modules])
        return None, 1.0 if len(calls) == 1 else 0.995  # the candidate: 0.5% faster, under the 1% margin

    out, order, decision = choose_branch_order(prof, 1e-9, search)
    assert out is prof and order is None and decision["chosen"] is None
    assert calls[1][:3] == ["c1", "c2", "c3"]


def test_plans_carry_module_order_and_older_plans_load():
    prof = towers()
    cluster = cluster_for(prof, 1.0)
    plan = make_plan("caramel", prof, cluster, world_size=2, compute_schedule="off", input_spread=0, branch_order="auto")
    back = Plan.from_dict(plan.to_dict())
    assert back.module_order == plan.module_order and back.fingerprint == plan.fingerprint
    old = plan.to_dict()
    del old["module_order"], old["fingerprint"]  # a plan written before the field existed
    loaded = Plan.from_dict(old)
    assert loaded.module_order is None and loaded.fingerprint != plan.fingerprint


def test_option_spelling_and_errors():
    assert STRATEGIES.spec("caramel:branch_order=auto").options.branch_order == "auto"
    assert CaramelOptions().branch_order == "off"
    assert CaramelOptions(branch_order="auto").planner_options() == {"branch_order": "auto"}
    with pytest.raises(CaramelError, match="branch_order"):
        CaramelOptions(branch_order="sometimes")
    with pytest.raises(CaramelError, match="branch_order is for planner caramel"):
        CaramelOptions(planner="fifo", branch_order="auto")
