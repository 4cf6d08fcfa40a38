"""balance="batch": the share schedule and sampler (no sample lost or repeated, across changes
and a resume), the counts from measured rates, and a 2-rank gloo run against single-process
training on the union batch, then with a slowed rank, both also under torch DDP (DDP's
schedule, which the overlap trial may keep)."""
import pytest
import torch

from caramel.data.share_sampler import ShareSampler, ShareSchedule
from caramel.errors import CaramelError
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.options import build_options
from caramel.testing import run_workers

torch.set_num_threads(1)


def test_counts_follow_rates_and_sum_to_the_global_batch():
    from caramel.strategies.caramel.balance import counts_for_costs

    def counts_from_rates(rates, global_batch):  # no fixed cost: a rank's time is n / rate
        return counts_for_costs([(0.0, 1.0 / r) for r in rates], global_batch)
    assert counts_from_rates([1.0, 1.0], 8) == [4, 4]
    assert counts_from_rates([2.0, 1.0], 12) == [8, 4]
    assert counts_from_rates([1.0, 1000.0], 8) == [1, 7]  # every rank keeps a sample
    assert sum(counts_from_rates([0.3, 0.5, 0.7], 31)) == 31


def test_the_cost_fit_separates_fixed_from_per_sample_time():
    from caramel.strategies.caramel.balance import fit_cost
    fixed, per_sample, fitted = fit_cost({64: 0.010 + 64 * 0.001, 128: 0.010 + 128 * 0.001})
    assert (fixed, per_sample) == pytest.approx((0.010, 0.001)) and fitted
    assert fit_cost({100: 0.2}) == pytest.approx((0.0, 0.002, False))  # one size: all of it per sample
    # noise that makes the line fall with n is not physical: through the origin instead
    assert fit_cost({10: 0.30, 20: 0.25}) == pytest.approx((0.0, (3.0 + 5.0) / 500.0, False))
    # sizes 2 samples apart: the slope would be noise (0.1 ms per sample here, against 0.31);
    # the last fitted fixed cost stays and the per-sample cost is re-estimated under it
    close = {128: 0.0500, 130: 0.0502}
    fixed, per_sample, fitted = fit_cost(close, prior_fixed_s=0.010)
    assert not fitted and fixed == 0.010
    assert per_sample == pytest.approx((0.040 * 128 + 0.0402 * 130) / (128 ** 2 + 130 ** 2))
    assert fit_cost(close)[:2] == pytest.approx((0.0, (0.05 * 128 + 0.0502 * 130) / (128 ** 2 + 130 ** 2)))


def test_counts_minimize_the_slowest_rank_with_fixed_costs():
    from caramel.strategies.caramel.balance import counts_for_costs, predicted_s
    assert counts_for_costs([(0.0, 1.0), (0.0, 2.0)], 12) == [8, 4]
    assert counts_for_costs([(10.0, 1.0), (0.0, 1.0)], 20) == [5, 15]  # rank 0 pays 10 samples' worth per step
    counts = counts_for_costs([(0.3, 0.01), (0.1, 0.03), (0.0, 0.02)], 97)
    best = min(predicted_s([(0.3, 0.01), (0.1, 0.03), (0.0, 0.02)], [a, b, 97 - a - b])
               for a in range(1, 96) for b in range(1, 97 - a))
    assert sum(counts) == 97 and predicted_s([(0.3, 0.01), (0.1, 0.03), (0.0, 0.02)], counts) == pytest.approx(best)


def test_two_sizes_put_the_shares_where_the_ranks_finish_together():
    """Ranks whose step is a fixed cost plus a per-sample cost (rank 1's per-sample cost 2x):
    from equal shares the per-sample estimate misses (the fixed cost dilutes the difference);
    after one change the fit has two sizes and lands on the counts that equalize the ranks."""
    from caramel.strategies.caramel.balance import counts_for_costs, fit_cost, predicted_s
    true = [(0.020, 0.0002), (0.020, 0.0004)]
    seen: list[dict[int, float]] = [{}, {}]
    counts = [128, 128]
    history = []
    for _ in range(3):
        for r, (a, b) in enumerate(true):
            seen[r][counts[r]] = a + b * counts[r]
        costs = [fit_cost(s)[:2] for s in seen]
        counts = counts_for_costs(costs, 256)
        history.append(counts)
    ideal = counts_for_costs(true, 256)
    assert history[0][1] > ideal[1]  # the per-sample estimate gives the slow rank too many
    assert history[1] == ideal and history[2] == ideal
    assert predicted_s(true, ideal) < predicted_s(true, history[0])


def test_every_sample_once_per_epoch_across_share_changes_and_a_resume():
    sched = [ShareSchedule(10, 3) for _ in range(3)]
    samplers = [ShareSampler(53, s, r, seed=1) for r, s in enumerate(sched)]
    taken = [[] for _ in range(3)]
    iters = [iter(s) for s in samplers]
    for i in range(5):  # 5 global batches per epoch (53 // 10)
        if i == 2:
            for s in sched:
                s.change([1, 2, 7], s.drawn)
        if i == 3:  # rank 2 resumes from a saved schedule
            saved = sched[2].state_dict()
            sched[2] = ShareSchedule(10, 3)
            sched[2].load_state_dict(saved)
            samplers[2] = ShareSampler(53, sched[2], 2, seed=1)
            iters[2] = iter(samplers[2])
        for r in range(3):
            taken[r].append(next(iters[r]))
    assert [len(b) for b in taken[2]] == [3, 3, 7, 7, 7]
    flat = [i for r in range(3) for b in taken[r] for i in b]
    assert len(flat) == 50 and len(set(flat)) == 50  # none lost (of the 50 drawn) or repeated


def test_balance_options_are_checked():
    assert build_options(CaramelOptions, {"balance": "batch"}).balance == "batch"
    with pytest.raises(CaramelError, match="balance must be one of off, batch, dropout"):
        build_options(CaramelOptions, {"balance": "shares"})


def _exact_windows(windows: dict, s_per_sample: float) -> bool:
    """Whether every compute time in the balancer's windows is its size's slowed forward exactly."""
    return bool(windows) and all(t == pytest.approx(n * s_per_sample) for n, ts in windows.items() for t in ts)


@pytest.mark.timeout(240)
def test_unequal_shares_equal_the_union_batch_and_a_slow_rank_gets_fewer():
    """The slowed runs' forwards pass on a virtual clock from the plan's adoption on (profiling
    and planning sleep for real), so every timed step is exact and the shares do not depend on
    the host's load (wall-clock windows made this test fail under load)."""
    from tests.strategies.adapt.adapt_workers import _DDP_SLOW_S_PER_SAMPLE, _SLOW_S_PER_SAMPLE, balance_worker
    results = run_workers(balance_worker, 2, args=(6, 8), timeout_s=220)
    for rank, res in enumerate(results):
        assert res["union"] <= 1e-5, res["union"]
        assert res["sizes"] == ([2, 2, 2, 2, 5, 5] if rank == 0 else [6, 6, 6, 6, 3, 3])
        # rank 1 slowed 2 ms per sample, rank 0 1 ms: the windows hold each step's forward exactly,
        # and one change gives rank 0 more: the min-max counts (6 and 4 ms; [5, 3] ties, going to rank 0)
        assert res["on_the_clock"] and _exact_windows(res["windows"], _SLOW_S_PER_SAMPLE[rank]), res["windows"]
        # [6, 2] and [5, 3] tie on the slowest forward (6 ms); which one the fit lands on is set
        # by the step's unclocked part (seen both ways), so the check is that the one change is a
        # min-max split of the 8 samples that gives the slow rank fewer
        slow_s = _SLOW_S_PER_SAMPLE
        best_s = min(max(k * slow_s[0], (8 - k) * slow_s[1]) for k in range(1, 8))
        assert res["changes"] == 1 and sum(res["counts"]) == 8 and res["counts"][0] > res["counts"][1], res["counts"]
        assert max(c * s for c, s in zip(res["counts"], slow_s)) == pytest.approx(best_s), res["counts"]
    # at equal shares rank 0's gradient wait is held by rank 1's lead, 4 x (2 - 1) ms, and timed by
    # the engine; the exact windows above hold only if the balancer takes that wait out of the step
    waits = [res["equal_waits_s"] for res in results]
    assert len(waits[0]) >= 3 and waits[0] == [pytest.approx(0.004)] * len(waits[0]), waits
    assert waits[1] == [0.0] * len(waits[1]), waits
    drawn = [i for res in results for b in res["drawn"] for i in b]
    per_epoch = 96 // 8 * 8
    assert len(drawn) == 2 * per_epoch and all(drawn.count(i) == 2 for i in set(drawn))  # each sample once per epoch
    # DDP's schedule (torch DDP, share-weighted by SharesHook, 3 buckets, a layer only some
    # samples use): exact on the union batch; at
    # equal shares (4 samples each, the steps under DDP before the first change applies) the
    # slowed rank sleeps 16 ms a step, which its peer waits, timed, and the balancer sees it
    # (without the hook: equal weights, no wait timed, so equal compute on both ranks and no change)
    for rank, res in enumerate(results):
        assert res["ddp_delegating"] == [False] * 4 + [True] * 6, res["ddp_delegating"]
        assert res["ddp_union"] <= 1e-5, res["ddp_union"]
        assert res["ddp_buckets"] >= 2, res["ddp_buckets"]  # the latest ready / latest done over several buckets
        # slowed 4 ms per sample on rank 1, 1 ms on rank 0 (one bucket: the hold is one per step):
        # with rank 0's timed wait taken out, its windows hold its own forwards, and the first
        # decision after the hand-over levels the ranks ([7, 1]: 7 and 4 ms)
        assert res["ddp_on_the_clock"] and res["ddp_buckets_slowed"] == 1, res
        assert _exact_windows(res["ddp_windows"], _DDP_SLOW_S_PER_SAMPLE[rank]), res["ddp_windows"]
        assert res["ddp_change_steps"] == [8] and res["ddp_counts"] == [7, 1], res
    # the gated layer went unused on one rank and used on the other in some steps under DDP
    assert any(a != b for a, b in zip(results[0]["ddp_extra_used"], results[1]["ddp_extra_used"]))
    # at equal shares rank 0 waits rank 1's lead, 4 x (4 - 1) ms, timed by the hook; rank 1 waits nothing
    waits = [res["ddp_equal_waits_s"] for res in results]
    assert len(waits[0]) >= 3 and waits[0] == [pytest.approx(0.012)] * len(waits[0]), waits
    assert waits[1] == [0.0] * len(waits[1]), waits


def test_ddp_schedule_is_a_trial_candidate_with_batch_shares_not_with_drops():
    from types import SimpleNamespace

    from caramel.strategies.caramel.balance import Balancer
    from caramel.strategies.caramel.controller import Controller
    from caramel.strategies.caramel.dropout import DropoutBalancer
    from caramel.strategies.caramel.trial import DDP_SCHEDULE

    def names(balancer, compression="none"):
        c = SimpleNamespace(trial_steps=5, planner="caramel", engine=SimpleNamespace(overlap="forward"),
                            compression=compression, balancer=balancer)
        return [name for name, _, _ in Controller.trial_specs(c)]

    assert DDP_SCHEDULE in names(None)
    assert DDP_SCHEDULE in names(Balancer.__new__(Balancer))  # torch DDP weights the shares through SharesHook
    assert DDP_SCHEDULE not in names(DropoutBalancer.__new__(DropoutBalancer))  # per-entry counts: not DDP's average
    assert DDP_SCHEDULE not in names(Balancer.__new__(Balancer), compression="fp16")


def test_the_simulator_predicts_balanced_shares_on_uneven_workers():
    from caramel.strategies.caramel.simulate import simulate_caramel
    from caramel.topology.spec import ClusterSpec, WorkerSpec
    from tests.sim.helpers import two_layer_profile
    prof = two_layer_profile()
    uneven = ClusterSpec([WorkerSpec("fast", 1.0), WorkerSpec("slow", 0.5)], bandwidth_bps=1e9, latency_s=1e-6)
    equal = simulate_caramel(prof, uneven, build_options(CaramelOptions, {"overlap": "forward"}))
    balanced = simulate_caramel(prof, uneven, build_options(CaramelOptions, {"overlap": "forward", "balance": "batch"}))
    # compute 3.2 s at speed 1: 6.4 s on the slow worker with equal shares, 3.2 / 0.75 balanced
    assert equal.step_time_s == pytest.approx(6.4, rel=0.02)
    assert balanced.step_time_s == pytest.approx(3.2 / 0.75, rel=0.02)


def test_a_processs_first_step_adds_no_time_to_the_window():
    # a fresh engine's first step (a resumed run's too) has no period: nothing to count
    import torch.nn as nn
    from types import SimpleNamespace

    from caramel.runtime.stats import EngineStats
    from caramel.strategies.caramel.balance import Balancer

    engine = SimpleNamespace(stats=EngineStats(), remove_at_release=lambda *handles: None)
    b = Balancer(engine, nn.Linear(2, 2), None, 0, 1, every=0)
    b.schedule, b.local_batch = ShareSchedule(4, 1), 4
    b.step_end()
    assert engine.stats.last_step_s is None and not b.times
    engine.stats.last_step_s = 0.012
    b.step_end()
    assert list(b.times[4]) == [0.012]


def test_the_decisions_gather_is_a_wait_not_compute(monkeypatch):
    """A faster rank blocks in the decision's all-gather until the slower one arrives (the
    reductions overlap the next forward: the ranks are not level at a step's end). That time is
    counted as a wait of the step it falls in, so it does not read as this rank's compute."""
    import torch.nn as nn
    from types import SimpleNamespace

    import caramel.strategies.caramel.balance as balance
    from caramel.runtime.stats import EngineStats

    clock_s, waits = [100.0], []

    def gather(out, mine, group):
        clock_s[0] += 0.07  # blocked on the slower rank
        out[:] = [mine] * len(out)

    monkeypatch.setattr(balance.dist, "all_gather_object", gather)
    engine = SimpleNamespace(stats=EngineStats(), remove_at_release=lambda *handles: None,
                             recorder=SimpleNamespace(now=lambda: clock_s[0]), count_wait=waits.append)
    b = balance.Balancer(engine, nn.Linear(2, 2), None, 0, 2, every=1)
    b.schedule, b.local_batch = ShareSchedule(4, 2), 2
    engine.stats.last_step_s = 0.012
    b.step_end()
    assert waits == [pytest.approx(0.07)]
