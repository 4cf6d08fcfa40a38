"""The local search after decoding: it keeps every placement feasible, never makes one worse,
reports the cost `Instance.cost_s` computes, and stops only where no relocation and no
exchange (checked one by one, by the scalar objective) gains, guided by a focus or not;
refused input."""
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from caramel.errors import CaramelError
from caramel.sched.placement import HEURISTICS, InstanceOptions, random_instance
from caramel.sched.placement.local_search import SearchOptions, local_search
from caramel.sched.placement.tables import StepTables

MID = InstanceOptions(num_tasks=5, num_layers=3, num_edge=3)
TIGHT = InstanceOptions(num_tasks=6, num_layers=4, num_edge=4, memory_fraction=0.1)
LARGE = InstanceOptions(num_tasks=30, num_layers=8, num_edge=3)


def _moves(inst, placement, swaps):
    """Every relocation (one layer to another node) and every exchange (layer Y to the node of
    an edge layer X of another task, X to another node with room for it now, or with `swaps`
    to any other node: Y's included), as placements; infeasible ones included (the caller
    skips them)."""
    free = np.array(inst.memory_mb) - inst.memory_used_mb(placement)
    cells = [(t, l) for t, row in enumerate(placement) for l in range(len(row))]
    for (t, l), b in itertools.product(cells, range(inst.num_nodes)):
        if b != placement[t][l]:
            p = [list(r) for r in placement]
            p[t][l] = b
            yield p
    for (ty, ly), (tx, lx) in itertools.product(cells, cells):
        e = placement[tx][lx]
        if ty == tx or e == inst.cloud or placement[ty][ly] == e:
            continue
        for c in range(inst.num_nodes):
            room = c == inst.cloud or inst.tasks[tx].weights_mb[lx] <= free[c] + 1e-9
            if c != e and (swaps or room):
                p = [list(r) for r in placement]
                p[ty][ly], p[tx][lx] = e, c
                yield p


@pytest.mark.parametrize("swaps", [False, True], ids=["exchanges", "swaps"])
@pytest.mark.parametrize("opts,seeds", [(MID, range(4)), (TIGHT, range(3))], ids=["mid", "tight"])
def test_search_ends_where_no_relocation_or_exchange_gains(opts, seeds, swaps):
    options = SearchOptions(max_passes=1000, swaps=swaps)
    for seed, start in itertools.product(seeds, ("all_cloud", "greedy_regret")):
        inst = random_instance(opts, seed)
        before = HEURISTICS[start](inst)
        found = local_search(inst, before, options)
        assert found.passes < options.max_passes
        assert inst.feasible(found.placement)
        assert found.cost_s == pytest.approx(inst.cost_s(found.placement), rel=1e-12)
        assert found.cost_s <= inst.cost_s(before)
        # a move the search would take gains more than min_gain of the cost it started from
        limit = found.cost_s - options.min_gain * inst.cost_s(before) - 1e-12 * found.cost_s
        for p in _moves(inst, found.placement, swaps):
            assert not (inst.feasible(p) and inst.cost_s(p) < limit), (seed, start, p)


def test_search_improves_large_placements_and_keeps_them_feasible():
    for seed in range(2):
        inst = random_instance(LARGE, seed)
        tables = StepTables(inst)
        for name in ("all_cloud", "greedy_myopic", "greedy_regret"):
            before = HEURISTICS[name](inst)
            found = local_search(inst, before, tables=tables)
            assert inst.feasible(found.placement) and found.moves > 0
            assert found.cost_s == pytest.approx(inst.cost_s(found.placement), rel=1e-12)
            assert found.cost_s < inst.cost_s(before)
        # no pass: the placement back as it was
        same = local_search(inst, before, SearchOptions(max_passes=0), tables=tables)
        assert same.placement == before and same.moves == 0


@pytest.mark.parametrize("swaps", [False, True], ids=["exchanges", "swaps"])
@pytest.mark.parametrize("opts,seeds", [(LARGE, range(2)), (TIGHT, range(3))], ids=["large", "tight"])
def test_every_pass_keeps_feasibility_and_lowers_the_cost(opts, seeds, swaps):
    # one pass at a time, every move with a gain allowed in it: a move applied with a gain
    # computed against a neighbour another move of the same pass changed shows as a worse pass
    options = SearchOptions(max_passes=1, moves_per_pass=1000, min_gain=0.0, swaps=swaps)
    for seed, start in itertools.product(seeds, ("all_cloud", "greedy_myopic")):
        inst = random_instance(opts, seed)
        tables = StepTables(inst)
        placement = HEURISTICS[start](inst)
        for _ in range(40):
            found = local_search(inst, placement, options, tables=tables)
            assert inst.feasible(found.placement)
            before, after = inst.cost_s(placement), inst.cost_s(found.placement)
            if found.moves == 0:
                assert found.placement == placement
                break
            assert after < before, (seed, start, before, after)
            placement = found.placement
        else:
            pytest.fail(f"no convergence in 40 passes (seed {seed}, {start})")


def _focus(inst, rng, fraction):
    lmax = max(len(t.gflop) for t in inst.tasks)
    mask = rng.random((len(inst.tasks), lmax)) < fraction
    mask[0, 0] = True  # never empty
    return mask


@pytest.mark.parametrize("opts,seeds", [(MID, range(3)), (TIGHT, range(3))], ids=["mid", "tight"])
def test_a_guided_search_ends_where_no_relocation_or_exchange_gains(opts, seeds):
    """The focus layers move first, then every layer: it stops only where the whole
    neighbourhood has no gaining move, as the unguided search does (checked move by move)."""
    rng = np.random.default_rng(7)
    options = SearchOptions(max_passes=1000)
    for seed, start in itertools.product(seeds, ("all_cloud", "greedy_regret")):
        inst = random_instance(opts, seed)
        before = HEURISTICS[start](inst)
        focus = _focus(inst, rng, 0.3)
        found = local_search(inst, before, options, focus=focus)
        assert found == local_search(inst, before, options, focus=focus.copy())  # deterministic
        assert found.converged and found.guided_passes < found.passes
        assert inst.feasible(found.placement) and found.cost_s <= inst.cost_s(before)
        assert found.cost_s == pytest.approx(inst.cost_s(found.placement), rel=1e-12)
        limit = found.cost_s - options.min_gain * inst.cost_s(before) - 1e-12 * found.cost_s
        for p in _moves(inst, found.placement, False):
            assert not (inst.feasible(p) and inst.cost_s(p) < limit), (seed, start, p)


def test_a_guided_pass_moves_only_focus_layers_and_their_exchange_partners():
    """A pass on the focus moves a layer outside it only as an exchange's X (off an edge node,
    at most one per focus layer moved); a focus of every layer searches as no focus does."""
    inst = random_instance(LARGE, 1)
    tables = StepTables(inst)
    start = HEURISTICS["greedy_myopic"](inst)
    focus = _focus(inst, np.random.default_rng(3), 0.15)
    one = local_search(inst, start, SearchOptions(max_passes=1), tables=tables, focus=focus)
    assert one.guided_passes == 1 and one.moves > 0
    moved = [(t, l) for t, row in enumerate(start) for l in range(len(row)) if one.placement[t][l] != row[l]]
    inside = [m for m in moved if focus[m]]
    outside = [m for m in moved if not focus[m]]
    assert inside and len(outside) <= len(inside)
    assert all(start[t][l] != inst.cloud for t, l in outside)
    everything = local_search(inst, start, tables=tables, focus=np.ones(focus.shape, dtype=bool))
    plain = local_search(inst, start, tables=tables)
    assert (everything.placement, everything.cost_s, everything.passes, everything.moves) == \
        (plain.placement, plain.cost_s, plain.passes, plain.moves)
    assert everything.guided_passes == plain.passes - 1 and plain.guided_passes == 0


@pytest.mark.parametrize("opts,seed", [(MID, 2), (LARGE, 2)], ids=["mid", "large"])
def test_a_guided_search_grows_its_focus_along_the_chain(opts, seed):
    """From every layer on the cloud with the focus one layer, (0, 0): a cloud layer moves only
    as Y, so the later layers of task 0 leaving the cloud in the guided passes (the search cut
    at `guided_passes`) joined the focus as chain neighbours of moved layers, one per pass."""
    inst = random_instance(opts, seed)
    start = HEURISTICS["all_cloud"](inst)
    focus = np.zeros((len(inst.tasks), max(len(t.gflop) for t in inst.tasks)), dtype=bool)
    focus[0, 0] = True
    guided = local_search(inst, start, SearchOptions(max_passes=1000), focus=focus).guided_passes
    cut = local_search(inst, start, SearchOptions(max_passes=guided), focus=focus)
    assert cut.guided_passes == cut.passes == guided >= 3
    moved = [(t, l) for t, row in enumerate(start) for l in range(len(row)) if cut.placement[t][l] != row[l]]
    assert moved == [(0, l) for l in range(guided)]


GOLDEN = Path(__file__).resolve().parent / "data" / "local_search_golden.json"
GOLDEN_SIZES = {"3x4": InstanceOptions(num_tasks=3, num_layers=4, num_edge=3),
                "10x6": InstanceOptions(num_tasks=10, num_layers=6, num_edge=3),
                "12x5-tight": InstanceOptions(num_tasks=12, num_layers=5, num_edge=3, memory_fraction=0.15),
                "30x8": InstanceOptions(num_tasks=30, num_layers=8, num_edge=3)}


def test_the_unguided_search_finds_what_it_found_before_the_focus():
    """The golden: 12 searches (4 sizes, three starts, swaps on and off) run by the code before
    the focus existed (commit 9726bb1, stored with their starts); without a focus the search
    ends on the same placements after the same passes and moves."""
    golden = json.loads(GOLDEN.read_text())
    assert golden["commit"] == "9726bb1" and len(golden["searches"]) == 12
    for g in golden["searches"]:
        inst = random_instance(GOLDEN_SIZES[g["size"]], g["seed"])
        assert HEURISTICS[g["start"]](inst) == g["before"], (g["size"], g["seed"], g["start"])
        found = local_search(inst, g["before"], SearchOptions(swaps=g["swaps"]))
        assert (found.placement, found.passes, found.moves, found.converged, found.guided_passes) == \
            (g["placement"], g["passes"], g["moves"], g["converged"], 0), (g["size"], g["seed"], g["start"])
        assert found.cost_s == pytest.approx(g["cost_s"], rel=1e-12)


def test_heuristics_given_tables_place_as_without():
    inst = random_instance(LARGE, 3)
    tables = StepTables(inst)
    for name in ("greedy_myopic", "greedy_lookahead", "greedy_regret"):
        assert HEURISTICS[name](inst, tables) == HEURISTICS[name](inst)


def test_bad_inputs_are_refused():
    inst = random_instance(MID, 0)
    good = HEURISTICS["greedy_regret"](inst)
    for kw, match in (({"max_passes": -1}, "max_passes"), ({"max_passes": 1.5}, "max_passes"),
                      ({"max_passes": True}, "max_passes"), ({"moves_per_pass": 0}, "moves_per_pass"),
                      ({"moves_per_pass": False}, "moves_per_pass"), ({"min_gain": -1.0}, "min_gain"),
                      ({"min_gain": "x"}, "min_gain must be a number"), ({"min_gain": True}, "min_gain"),
                      ({"swaps": 1}, "swaps must be true or false")):
        with pytest.raises(CaramelError, match=match):
            SearchOptions(**kw)
    with pytest.raises(CaramelError, match="options must be a SearchOptions"):
        local_search(inst, good, {"max_passes": 3})
    with pytest.raises(CaramelError, match="tables must be"):
        local_search(inst, good, tables=object())
    for other in (random_instance(MID, 1), random_instance(TIGHT, 0)):  # same shape; another shape
        with pytest.raises(CaramelError, match="tables were built for another instance"):
            local_search(inst, good, tables=StepTables(other))
    with pytest.raises(CaramelError, match="one node list per task"):
        local_search(inst, good[:-1])
    with pytest.raises(CaramelError, match="task 0 must have 3 nodes"):
        local_search(inst, [good[0][:-1]] + good[1:])
    crowded = [[0] * len(row) for row in good]  # every layer on edge node 0: over its memory
    assert not inst.feasible(crowded)
    with pytest.raises(CaramelError, match="feasible placement"):
        local_search(inst, crowded)
    for bad in (9, -1, 1.7, True, "0"):
        with pytest.raises(CaramelError, match=rf"placement\[1\]\[0\] must be a node.*got {bad!r}"):
            local_search(inst, [good[0], [bad] + good[1][1:]] + good[2:])
    for bad in (np.ones((5, 2), dtype=bool), np.ones((5, 3)), [[1] * 3] * 5):
        with pytest.raises(CaramelError, match=r"focus must be a \(5, 3\) bool array"):
            local_search(inst, good, focus=bad)
    assert local_search(inst, [[np.int64(n) for n in row] for row in good]).placement  # numpy ints are nodes
    assert np.isfinite(local_search(inst, good).cost_s)
