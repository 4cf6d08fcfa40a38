"""balance="batch" on a virtual clock (`balance_clock`): the shares settle near the counts at which
the ranks finish together, early, and do not swing back and forth under step-to-step noise.

The ranks' costs are the lines measured in the 2-worker digits runs (docs/results/
adapt-train-balance-6.json, at equal and at final shares): rank 0 2.5 ms + 0.207 ms per sample,
rank 1 (slowed 2x) 13.1 ms + 0.343 ms per sample; the ideal counts of 256 are [179, 77]. The
schedule is the overlap trial's as those runs ran it: profiling to step 4, then blocks of
forward overlap, backward, DDP's schedule (10 steps), backward, forward, then backward for good.
Two ways the first steps read slow, both seen in those runs: under forward overlap half of a
rank's wait reads as compute, or rank 0 runs 1.4x slower for its first 10 steps (warm-up; run 6
read up to 1.7x). Before, the first size's window stayed in the fit and held the shares past the
balance ([186, 70] or [190, 66], 3.7-5.8% slower than ideal) or swung them back and forth.
"""

from caramel.strategies.caramel.balance import Balancer, counts_for_costs
from tests.strategies.adapt.balance_clock import Clock, predicted_s, run

COSTS_S = [(0.0025, 0.000207), (0.0131, 0.000343)]
BLOCKS = [("forward", 5, 9), ("backward", 10, 14), ("ddp", 15, 24), ("backward2", 25, 29), ("forward2", 30, 34)]
FORWARD_READS = {"forward": 0.5, "forward2": 0.5}  # the share of a rank's wait its forward hides


def trial_schedule(step: int) -> str:
    if step < 5:
        return "profiling"
    return next((name for name, first, last in BLOCKS if first <= step <= last), "backward3")


def clock(**kw) -> Clock:
    return Clock(COSTS_S, 256, 120, schedules=trial_schedule, reads_wait_as_compute=FORWARD_READS, **kw)


def settled_from(counts: list[list[int]], within: float) -> int | None:
    """The first step from which every step's counts are within `within` of the ideal's step time."""
    best = predicted_s(COSTS_S, counts_for_costs(COSTS_S, 256))
    ok = [predicted_s(COSTS_S, c) <= best * (1.0 + within) for c in counts]
    return next((k for k in range(len(ok)) if all(ok[k:])), None)


def reversals(changes: list[dict]) -> int:
    moves = [c["counts"][0] - c["previous"][0] for c in changes]
    return sum(a * b < 0 for a, b in zip(moves, moves[1:]))


def test_shares_settle_early_after_slow_first_steps():
    assert counts_for_costs(COSTS_S, 256) == [179, 77]
    res = run(clock(), Balancer)
    s = settled_from(res["counts"], 0.01)
    assert s is not None and s <= 40, res["changes"]
    warm = Clock(COSTS_S, 256, 120, schedules=trial_schedule, episodes=[(5, 14, 0, 1.4)])
    res = run(warm, Balancer)
    s = settled_from(res["counts"], 0.02)
    assert s is not None and s <= 60, res["changes"]
    # with 5% noise on every step's compute most runs end within 2% of the ideal step and stay
    # (7 of 10 here; 1 of 10 before)
    settled = [settled_from(run(clock(noise=0.05, seed=seed), Balancer)["counts"], 0.02) for seed in range(10)]
    assert sum(s is not None for s in settled) >= 6, settled


def test_shares_do_not_swing_back_under_step_noise():
    """A move followed by one the other way is a swing: the balancer chased noise. At 10% noise
    per step through the trial, over 10 seeds, at most one run has one (before: 4 of 10)."""
    swung = []
    for seed in range(10):
        res = run(clock(noise=0.1, seed=seed), Balancer)
        if reversals(res["changes"]):
            swung.append((seed, [(c["from_batch"], c["counts"]) for c in res["changes"]]))
    assert len(swung) <= 1, swung


def test_a_resumed_run_confirms_the_reversal_the_stopped_one_proposed():
    """Slow spells, noise-free: the decision at step 30 proposes a move back and the one at 40
    confirms it. Stopped after step 30 and resumed from its checkpoint (its first step untimed),
    the run makes the same changes as the one never stopped."""
    spells = [(5, 12, 0, 1.3), (40, 49, 0, 1.3), (80, 86, 1, 1.2)]
    whole = run(Clock(COSTS_S, 256, 60, schedules=trial_schedule, episodes=spells), Balancer)["changes"]
    resumed = run(Clock(COSTS_S, 256, 60, schedules=trial_schedule, episodes=spells, resume_after=29),
                  Balancer)["changes"]
    assert [c["step"] for c in whole] == [10, 20, 40, 50], whole
    assert reversals(whole[:3]) == 1, whole  # the change at 40 is the reversal confirmed
    assert [(c["step"], c["counts"]) for c in resumed] == [(c["step"], c["counts"]) for c in whole], resumed


def test_checkpointed_reversal_is_checked_and_old_windows_trimmed():
    """A checkpoint from before `pending_reversal` loads with none pending; a malformed one is one
    error; an older controller's windows (4 sizes) load as the last `FIT_SIZES`."""
    from types import SimpleNamespace

    import pytest
    import torch.nn as nn

    from caramel.data.share_sampler import ShareSchedule
    from caramel.errors import CaramelError
    from caramel.runtime.stats import EngineStats
    from caramel.strategies.caramel.balance import FIT_SIZES
    from caramel.strategies.caramel.balance_state import balancer_state, load_balancer_state

    def balancer():
        engine = SimpleNamespace(stats=EngineStats(), remove_at_release=lambda *h: None)
        b = Balancer(engine, nn.Linear(1, 1), None, 0, 2, every=10)
        b.attach(ShareSchedule(256, 2))
        return b
    saved = balancer()
    saved.pending_reversal = [-1, 1]
    state = balancer_state(saved, 0, 2)
    resumed = balancer()
    load_balancer_state(resumed, state, 0, 2)
    assert resumed.pending_reversal == [-1, 1]
    for bad in ([-1], [2, -1], "up", [1.0, -1.0]):
        state["shared"]["pending_reversal"] = bad
        with pytest.raises(CaramelError, match="pending_reversal"):
            load_balancer_state(balancer(), state, 0, 2)
    del state["shared"]["pending_reversal"]
    state["ranks"][0]["times"] = [[128, [0.03]], [150, [0.034]], [170, [0.037]], [179, [0.04]]]
    older = balancer()
    older.pending_reversal = [1, -1]
    load_balancer_state(older, state, 0, 2)
    assert older.pending_reversal is None
    assert list(older.times) == [170, 179][-FIT_SIZES:] and FIT_SIZES == 2



def mean_excess(counts: list[list[int]]) -> float:
    """The mean step over the ideal's from step 10 (the table in docs/results/adapt-history.md)."""
    best = predicted_s(COSTS_S, counts_for_costs(COSTS_S, 256))
    return sum(predicted_s(COSTS_S, c) / best - 1.0 for c in counts[10:]) / len(counts[10:])


def test_fit_over_two_sizes_follows_slow_spells_at_low_noise():
    """Slow spells of either rank at 3% step noise: with the fit over the last 2 sizes, 5 seeds run
    3.3% over the ideal step on average, 4.5% with the fit over 4 (`FIT_SIZES` before); the
    trade-off (noise-free, 4 does better here) is in docs/adapt.md."""
    spells = [(5, 12, 0, 1.3), (40, 49, 0, 1.3), (80, 86, 1, 1.2)]
    excess = [mean_excess(run(Clock(COSTS_S, 256, 120, schedules=trial_schedule, noise=0.03, seed=seed,
                                    episodes=spells), Balancer)["counts"]) for seed in range(5)]
    assert sum(excess) / len(excess) < 0.038, excess


def test_a_rank_whose_compute_reads_zero_moves_no_shares():
    """A compute that reads 0 (the wait clamped at the period) gives no per-sample cost: every
    rank skips the decision alike, rather than giving that rank all but one sample per rank."""
    res = run(Clock([(0.0025, 0.000207), (0.0, 0.0)], 256, 40), Balancer)
    assert res["changes"] == [] and res["counts"][-1] == [128, 128], res["changes"]


def test_a_change_is_measured_before_the_next_decision():
    """A loader drawing 12 batches ahead runs a change only 12 steps after it is decided, past the
    next decision: that decision waits for the new counts to be timed instead of deciding again
    on the old ones (which would repeat the change from a later batch)."""
    res = run(Clock(COSTS_S, 256, 120, schedules=trial_schedule, draw_ahead=12), Balancer)
    changes = res["changes"]
    assert len(changes) >= 2, changes
    for before, after in zip(changes, changes[1:]):
        assert after["previous"] == before["counts"] and after["step"] > before["from_batch"], changes
