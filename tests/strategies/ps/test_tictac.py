"""TIC and TAC on small hand-built DAGs, against the definitions and against brute force."""
from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.ps.tictac import (PullGraph, _tac_before, efficiency, graph_from_profile, makespan, properties,
                                          tac_order, tic_order, tic_priorities)


def fork() -> PullGraph:
    """op0 reads r0 (2 s); op1 reads r1 and r2 (1 s); op2 joins both (1 s). Every recv takes 1 s."""
    return PullGraph(recv_s=(1.0, 1.0, 1.0), compute_s=(2.0, 1.0, 1.0), uses=((0,), (1, 2), ()), preds=((), (), (0, 1)))


def test_properties_follow_the_definitions():
    g = fork()
    assert g.deps() == [frozenset({0}), frozenset({1, 2}), frozenset({0, 1, 2})]
    P, Mp = properties(g, {0, 1, 2})
    assert P == {0: 2.0, 1: 0.0, 2: 0.0}  # only op0 waits for r0 alone
    assert Mp == {0: 3.0, 1: 2.0, 2: 2.0}  # op2 (all three) for r0; op1 (two) for r1, r2
    P, Mp = properties(g, {1})  # with r0 and r2 delivered, op1 and op2 wait for r1 alone
    assert P == {1: 2.0} and Mp == {1: math.inf}


def test_tic_counts_transfers_and_ties_share_a_priority():
    g = fork()
    assert tic_priorities(g) == {0: 3.0, 1: 2.0, 2: 2.0}
    assert tic_order(g) == [1, 2, 0]


def test_tac_sends_the_recv_that_unlocks_work_first_and_beats_tic_here():
    g = fork()
    assert tac_order(g) == [0, 1, 2]
    assert makespan(g, [0, 1, 2]) == 5.0  # op0 runs while r1 and r2 travel
    assert makespan(g, tic_order(g)) == 7.0
    assert makespan(g, tac_order(g)) == min(makespan(g, list(o)) for o in itertools.permutations(range(3)))


@pytest.mark.parametrize("seed", range(20))
def test_tac_comparator_is_johnsons_rule_for_two_recvs(seed):
    """Two recvs, each unlocking its own computation: A before B exactly when the paper's
    two-op makespan M_A + max(P_A, M_B) + P_B is the smaller (ties aside)."""
    rng = random.Random(seed)
    P = {0: rng.uniform(0, 3), 1: rng.uniform(0, 3)}
    M = (rng.uniform(0.1, 3), rng.uniform(0.1, 3))
    ab = M[0] + max(P[0], M[1]) + P[1]
    ba = M[1] + max(P[1], M[0]) + P[0]
    if abs(ab - ba) > 1e-9:
        assert _tac_before(0, 1, P, M, {0: 1.0, 1: 1.0}) == (ab < ba)


def _random_chain(rng: random.Random) -> PullGraph:
    n, k = rng.randint(2, 6), rng.randint(2, 6)
    uses: list[list[int]] = [[] for _ in range(k)]
    for r in range(n):
        uses[rng.randrange(k)].append(r)
    return PullGraph(tuple(rng.uniform(0.1, 2) for _ in range(n)), tuple(rng.uniform(0.1, 2) for _ in range(k)),
                     tuple(map(tuple, uses)), tuple((i - 1,) if i else () for i in range(k)))


def test_tac_is_optimal_on_chains_and_never_worse_than_random():
    """A forward in eager PyTorch is a chain of modules: there TAC matched the brute-force best
    order on every random instance, and was never slower than the mean random order."""
    rng = random.Random(7)
    for _ in range(60):
        g = _random_chain(rng)
        orders = [list(o) for o in itertools.permutations(range(len(g.recv_s)))]
        times = [makespan(g, o) for o in orders]
        tac = makespan(g, tac_order(g))
        assert tac == pytest.approx(min(times))
        assert tac <= statistics.mean(times) + 1e-12
        assert makespan(g, tic_order(g)) >= tac - 1e-12


def test_efficiency_and_speedup_bound():
    assert efficiency(2.0, 3.0, 3.0) == (1.0, pytest.approx(2 / 3))  # perfect overlap
    assert efficiency(2.0, 3.0, 5.0)[0] == 0.0  # none
    assert efficiency(2.0, 3.0, 4.0)[0] == pytest.approx(0.5)
    assert efficiency(0.0, 3.0, 3.0) == (1.0, 0.0)  # nothing to overlap


def test_graph_from_profile_is_the_forward_chain():
    prof = synthetic_profile(sizes_bytes=[4000, 1000, 2000], forward_time_s=0.03)
    g, index = graph_from_profile(prof, latency_s=1e-4, bandwidth_Bps=1e6)
    assert index == [0, 1, 2]
    assert g.recv_s == pytest.approx((1e-4 + 4e-3, 1e-4 + 1e-3, 1e-4 + 2e-3))
    assert g.preds == tuple(() if k == 0 else (k - 1,) for k in range(len(prof.modules)))
    assert [r for us in g.uses for r in us] == sorted(r for us in g.uses for r in us)  # first use in order
    assert tac_order(g) == [0, 1, 2]


def test_bad_graphs_and_orders_are_errors():
    with pytest.raises(CaramelError, match="predecessor"):
        PullGraph((1.0,), (1.0, 1.0), ((0,), ()), ((), (1,)))
    with pytest.raises(CaramelError, match="permutation"):
        makespan(fork(), [0, 0, 1])
    with pytest.raises(CaramelError, match="bandwidth"):
        graph_from_profile(synthetic_profile(sizes_bytes=[10]), 0.0, 0.0)


def test_a_runs_s_is_the_median_of_the_steps_e_is_taken_over():
    """S was the last step's while E was the median over the steady steps: E x S then paired two
    steps' numbers. Both are medians over the same steps, with (m - U) / L = -E S per step."""
    from types import SimpleNamespace as NS

    from caramel.strategies.ps.run import PsRun

    plan = NS(order="tac", placement="colocated", shards=[], buckets=[], pull_buckets=[], predicted={}, loads=[])
    engine = NS(plan=plan, steps=8, wait_s=0.0, stale=None, applied=8)
    opts = NS(consistency="bsp", bucket_cap_mb=25, pull_cap_mb=lambda: 4)
    log = [{"staleness": 0, "E": 0.0, "S": 9.0}] * 2 + [  # warm-up steps: left out
        {"staleness": 0, "E": e, "S": s} for e, s in ((0.5, 0.4), (0.8, 0.6), (0.7, 0.5), (0.6, 0.1))] + [
        {"staleness": 0}] * 2  # steps without a timed pull graph
    run = NS(engine=engine, options=opts, log=log, pull_comm_s=0.1)
    st = PsRun.stats_dict(run)
    assert st["E_median"] == pytest.approx(0.65) and st["S"] == pytest.approx(0.45)  # not the last step's 0.1
    assert st["beyond_U_over_L_median"] == pytest.approx(statistics.median([-0.2, -0.48, -0.35, -0.06]))
