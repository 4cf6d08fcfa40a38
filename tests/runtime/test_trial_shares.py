"""The overlap trial at balance="batch": candidates compared on steps at the latest shares (one
process; the shares of other ranks stood in by a patched all-gather)."""
import pytest

from caramel.strategies.caramel.trial import OverlapTrial
from tests.runtime.test_trial import _cands, _run, _three


def _sized(trial: OverlapTrial, steps: list[tuple[float, int]]) -> list:
    """Record (period, this rank's local batch size) steps."""
    return [trial.record(p, n=n) for p, n in steps]


def test_candidates_are_compared_on_steps_at_the_latest_shares():
    # balance="batch" moves the shares from 128 to 170 of this rank's samples during DDP's
    # (middle) block, after its first counted step: every candidate runs 100 ms a step at the
    # old shares; at the new ones forward 66, backward 65, DDP's schedule 70 ms. Mixing shares,
    # DDP's schedule (all but one step after the change) would look fastest (77.8 ms against
    # 83); on the latest shares' steps alone backward is, and DDP's one old step is no sample
    # (nor paired with a new one)
    trial = _three(steps=3, passes=1, confirm=False)
    trial.preference, trial.baseline = [], None  # the fastest wins outright
    t = 0.5
    _sized(trial, [(t, 128), (0.100, 128), (0.100, 128), (t, 128), (0.100, 128), (0.100, 128)])
    _sized(trial, [(t, 128), (0.100, 128), (0.070, 170), (0.071, 170), (0.070, 170), (0.069, 170)])
    out = _sized(trial, [(t, 170), (0.065, 170), (0.065, 170), (t, 170), (0.066, 170), (0.066, 170)])
    r = trial.result
    assert r is not None and r["chosen"] == "backward" and out[-1].name == "backward", r
    assert r["shares"] == [170] and r["retimed_passes"] == 0
    assert r["step_period_s"] == {"forward": pytest.approx(0.066), "backward": pytest.approx(0.065),
                                  "fifo/backward": pytest.approx(0.070)}
    assert r["samples"] == {"forward": 1, "backward": 1, "fifo/backward": 2}
    assert r["steps_counted"] == {"forward": 4, "backward": 4, "fifo/backward": 5}  # all the periods counted


def test_a_share_change_late_in_a_pass_times_every_candidate_again():
    # the change acts in DDP's block's last step (the default layout's change at step 20): DDP's
    # schedule has one step at the latest shares, less than a block counts, so the trial runs
    # another pass instead of judging it by steps at the old shares; the record holds both
    # passes, and the periods at the latest shares of the first are pooled with the second's
    trial = _three(steps=3, passes=3, confirm=False)
    t = 0.5
    _sized(trial, [(t, 128), (0.100, 128), (0.100, 128), (t, 128), (0.100, 128), (0.101, 128)])
    _sized(trial, [(t, 128), (0.100, 128), (0.099, 128), (0.100, 128), (0.101, 128), (0.070, 170)])
    _sized(trial, [(t, 170), (0.065, 170), (0.065, 170), (t, 170), (0.066, 170), (0.066, 170)])
    assert trial.result is None and trial.passes == 2 and trial.retimed == 1
    step = 0
    for p, n in ([(t, 170), (0.066, 170), (0.066, 170), (t, 170), (0.065, 170), (0.065, 170)]
                 + [(t, 170)] + [(0.072, 170)] * 5 + [(t, 170), (0.065, 170), (0.065, 170), (t, 170), (0.066, 170), (0.066, 170)]):
        step += 1
        trial.record(p, step=step, n=n)
    r = trial.result
    assert r is not None and r["passes"] == 2 and r["retimed_passes"] == 1 and r["shares"] == [170], r
    assert r["chosen"] == "backward" and r["fastest"] == "backward"
    # DDP's schedule: its one late step of the first pass and the second pass's five
    assert r["step_period_s"]["fifo/backward"] == pytest.approx(0.072)
    assert r["samples"]["fifo/backward"] == 2 and r["steps_counted"]["fifo/backward"] == 10
    assert r["samples"]["forward"] == 3  # its first pass's last block, both of the second's


def test_without_sizes_every_step_counts():
    # no balancer: no local batch sizes, the shares are unknown and every period counts as before
    trial = _three(steps=3, passes=1, confirm=False)
    trial.preference, trial.baseline = [], None
    t = 0.5
    _sized(trial, [(t, None), (0.100, None), (0.100, None), (t, None), (0.090, None), (0.090, None)]
           + [(t, None)] + [(0.080, None)] * 5 + [(t, None), (0.090, None), (0.090, None)]
           + [(t, None), (0.100, None), (0.100, None)])
    r = trial.result
    assert r["shares"] is None and r["chosen"] == "fifo/backward" and r["samples"]["fifo/backward"] == 2


def test_the_confirmation_compares_at_the_latest_shares_too():
    # forward leads clearly at the old shares and goes to the confirmation against DDP's
    # schedule (the baseline here); the shares change late in DDP's confirmation block: at the
    # new ones DDP's schedule is the faster (70 against 75 ms), which mixing shares would hide
    trial = _three(steps=3, passes=1, confirm=True)
    t = 0.5
    _sized(trial, [(t, 128), (0.080, 128), (0.080, 128), (t, 128), (0.100, 128), (0.100, 128)]
           + [(t, 128)] + [(0.100, 128)] * 5 + [(t, 128), (0.100, 128), (0.100, 128), (t, 128), (0.080, 128), (0.080, 128)])
    assert trial.selection is not None and trial.selection["chosen"] == "forward"
    out = _sized(trial, [(t, 128), (0.080, 128), (0.080, 128)] + [(t, 128), (0.100, 128), (0.100, 128), (0.100, 128),
                                                                  (0.070, 170), (0.070, 170)]
                 + [(t, 170), (0.075, 170), (0.075, 170)])
    r = trial.result
    assert r is not None and r["chosen"] == "fifo/backward" and out[-1].name == "fifo/backward", r
    c = r["confirmation"]
    assert c["confirmed"] is False and c["shares"] == [170] and r["shares"] == [128]
    assert c["step_period_s"] == {"forward": pytest.approx(0.075), "fifo/backward": pytest.approx(0.070)}


def test_the_controller_hands_the_trial_the_balancers_local_batch():
    # the wiring: the trial is told this rank's share of each step, so the comparison at the
    # latest shares is not silently off with balance="batch"
    from types import SimpleNamespace

    from caramel.strategies.caramel.balance import Balancer
    from caramel.strategies.caramel.controller import Controller

    trial = OverlapTrial(_cands(), steps=3, group=None, world=1, sized=True)
    balancer = Balancer.__new__(Balancer)
    balancer._steps, balancer.local_batch = 7, 170
    engine = SimpleNamespace(stats=SimpleNamespace(last_step_s=0.5, step=7))
    ctl = SimpleNamespace(trial=trial, balancer=balancer, engine=engine)
    Controller._trial_step_end(ctl)  # the block's transition: not counted
    engine.stats.last_step_s = 0.08
    Controller._trial_step_end(ctl)
    assert trial.candidates[0].blocks_n == [[170]] and trial.last_n == 170
    assert Controller.trial_sized.fget(ctl) is True
    assert Controller.trial_sized.fget(SimpleNamespace(balancer=None)) is False


def test_a_candidate_without_steps_at_the_latest_shares_after_the_last_pass_is_compared_on_all():
    # the change acts in forward's last block: backward and DDP's schedule have no step at the
    # latest shares and no pass is left, so all steps are compared (shares null), not the one
    # candidate that has steps there against nothing
    trial = _three(steps=3, passes=1, confirm=False)
    trial.preference, trial.baseline = [], None
    t = 0.5
    _sized(trial, [(t, 128), (0.100, 128), (0.100, 128), (t, 128), (0.090, 128), (0.090, 128)]
           + [(t, 128)] + [(0.095, 128)] * 5 + [(t, 128), (0.090, 128), (0.090, 128)]
           + [(t, 128), (0.120, 128), (0.060, 170)])
    r = trial.result
    assert r["shares"] is None and r["sized"] is True and r["chosen"] == "backward", r
    assert r["step_period_s"]["forward"] == pytest.approx(0.095)  # pairs 100 and 90 ms, all steps
    assert r["samples"] == {"forward": 2, "backward": 2, "fifo/backward": 2}


def test_no_pair_spans_a_share_change_inside_a_block():
    # backward's merged block counts 5 periods at sizes 128, 170, 128, 128, 128 (the shares go
    # there and back): the first period is alone between changes, so backward has one pair,
    # (60, 100), not (100, 60) across the 170-step and (60, 100) after it
    trial = OverlapTrial(_cands(), steps=3, group=None, world=1, sized=True)
    t = 0.5
    _sized(trial, [(t, 128), (0.080, 128), (0.080, 128)])
    _sized(trial, [(t, 128), (0.100, 128), (0.200, 170), (0.060, 128), (0.100, 128), (0.040, 128)])
    _sized(trial, [(t, 128), (0.080, 128), (0.080, 128)])
    r = trial.result
    assert r["shares"] == [128] and r["samples"] == {"forward": 2, "backward": 1}, r
    assert r["step_period_s"]["backward"] == pytest.approx(0.080)


def _ranks(monkeypatch, others: list) -> None:
    """Stand-ins for the collectives with world > 1 in one process: the all-gather returns this
    rank's sizes and `others`' (trials that ran the same steps at their own sizes); the
    all-reduce leaves the medians as this rank's."""
    import torch
    import torch.distributed as dist

    from caramel.strategies.caramel import trial as trial_mod

    def gather(out, mine, group=None):
        out[:] = [mine] + [([c.blocks_n for c in o.candidates], o.last_n) for o in others]
    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: None)
    monkeypatch.setattr(trial_mod, "collective_device", lambda group=None: torch.device("cpu"))


def test_the_shares_are_every_ranks_sizes_together(monkeypatch):
    # three workers: rank 0 keeps 100 samples while ranks 1 and 2 go from 50/106 to 78/78 in
    # backward's block; rank 0's own sizes never change, yet its steps before the change are
    # not at the latest shares
    steps = [(0.5, 0), (0.100, 0), (0.100, 0), (0.5, 0), (0.100, 0), (0.100, 0), (0.065, 1), (0.065, 1),
             (0.065, 1), (0.5, 1), (0.060, 1), (0.060, 1)]
    sizes = {0: (100, 100), 1: (50, 78), 2: (106, 78)}
    others = [OverlapTrial(_cands(), steps=3, group=None, world=1, sized=True) for _ in (1, 2)]
    for rank, o in zip((1, 2), others):
        _sized(o, [(p, sizes[rank][after]) for p, after in steps])
    _ranks(monkeypatch, others)
    trial = OverlapTrial(_cands(), steps=3, group=None, world=3, sized=True)
    _sized(trial, [(p, 100) for p, _ in steps])
    r = trial.result
    assert r["shares"] == [100, 78, 78] and r["samples"] == {"forward": 1, "backward": 1}, r
    assert r["step_period_s"] == {"forward": pytest.approx(0.060), "backward": pytest.approx(0.065)}


def test_ranks_that_counted_different_periods_fail_alike(monkeypatch):
    from caramel.errors import CaramelError

    other = OverlapTrial(_cands(), steps=3, group=None, world=1, sized=True)
    _sized(other, [(0.5, 50), (0.1, 50)])  # one period fewer than this rank's first block
    _ranks(monkeypatch, [other])
    trial = OverlapTrial(_cands(), steps=3, group=None, world=2, sized=True)
    with pytest.raises(CaramelError, match="different numbers of step periods"):
        _sized(trial, [(0.5, 100), (0.1, 100), (0.1, 100), (0.5, 100)] + [(0.1, 100)] * 5 + [(0.5, 100), (0.1, 100), (0.1, 100)])


def test_without_a_balancer_no_sizes_are_gathered(monkeypatch):
    import torch.distributed as dist

    def gather(*a, **k):
        raise AssertionError("gathered without a balancer")
    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: None)
    from caramel.strategies.caramel import trial as trial_mod
    import torch
    monkeypatch.setattr(trial_mod, "collective_device", lambda group=None: torch.device("cpu"))
    trial = OverlapTrial(_cands(), steps=3, group=None, world=2)
    _run(trial, [0.5, 0.1, 0.1, 0.5] + [0.09] * 5 + [0.5, 0.1, 0.1])
    assert trial.result["shares"] is None and trial.result["sized"] is False


def test_a_share_change_late_in_the_confirmation_runs_its_blocks_again():
    # passes at 128 pick forward; the confirmation runs forward, DDP's schedule, forward, and
    # the change acts in forward's last block: DDP's schedule has no step at the latest shares,
    # so the blocks run once more (same order) and the verdict rests on the steps at 170 only
    trial = _three(steps=3, passes=1, confirm=True)
    t = 0.5
    _sized(trial, [(t, 128), (0.080, 128), (0.080, 128), (t, 128), (0.100, 128), (0.100, 128)]
           + [(t, 128)] + [(0.100, 128)] * 5 + [(t, 128), (0.100, 128), (0.100, 128), (t, 128), (0.080, 128), (0.080, 128)])
    assert trial.selection["chosen"] == "forward"
    out = _sized(trial, [(t, 128), (0.070, 128), (0.070, 128)] + [(t, 128)] + [(0.100, 128)] * 5
                 + [(t, 128), (0.070, 128), (0.090, 170)])
    assert trial.result is None and trial.confirm_retimed and out[-1].name == "forward"  # it goes on
    assert trial.blocks[-3:] == [(0, 3), (2, 6), (0, 3)]
    out = _sized(trial, [(t, 170), (0.090, 170), (0.090, 170)] + [(t, 170)] + [(0.080, 170)] * 5
                 + [(t, 170), (0.090, 170), (0.090, 170)])
    r = trial.result
    assert r is not None and r["chosen"] == "fifo/backward" and out[-1].name == "fifo/backward", r
    c = r["confirmation"]
    assert c["retimed"] is True and c["shares"] == [170] and c["confirmed"] is False
    assert c["step_period_s"] == {"forward": pytest.approx(0.090), "fifo/backward": pytest.approx(0.080)}
    assert r["retimed_passes"] == 0 and r["passes"] == 1
