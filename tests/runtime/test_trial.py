"""The overlap trial's bookkeeping and choice, on recorded step periods (one process)."""
import pytest

from caramel.strategies.caramel.trial import PREDICTED_TIE, Candidate, OverlapTrial, choose, trial_baseline, trial_preference


def _cands() -> list[Candidate]:
    # the plans are not looked at by the trial; any object stands in
    return [Candidate("forward", "forward", plan=object()), Candidate("backward", "backward", plan=object())]  # type: ignore[arg-type]


def test_choose_takes_the_fastest_and_the_first_on_a_tie():
    assert choose({"forward": 0.090, "backward": 0.077}) == "backward"
    assert choose({"forward": 0.070, "backward": 0.077}) == "forward"
    assert choose({"forward": 0.077, "backward": 0.077}) == "forward"


def _run(trial: OverlapTrial, periods: list[float]) -> list:
    return [trial.record(t) for t in periods]


def test_trial_runs_a_bb_a_blocks_and_picks_the_faster_median_without_transition_steps():
    trial = OverlapTrial(_cands(), steps=3, group=None, world=1)
    assert trial.blocks == [(0, 3), (1, 6), (0, 3)] and trial.total_steps() == 12
    assert trial.current.overlap == "forward"
    # forward block: a slow transition step (not counted), then 80, 82 ms (one pair: 81 ms)
    out = _run(trial, [0.500, 0.080, 0.082])
    assert out[:2] == [None, None] and out[2].overlap == "backward"
    # backward block: transition, then 70, 95, 71, 72, 73 ms (pairs 82.5, 71.5; the odd one out
    # is not paired)
    out = _run(trial, [0.300, 0.070, 0.095, 0.071, 0.072, 0.073])
    assert out[:5] == [None] * 5 and out[5].overlap == "forward" and trial.result is None
    # forward again: transition, 81, 79 ms (pair 80 ms; never paired with the other block's steps)
    out = _run(trial, [0.400, 0.081, 0.079])
    assert out[2].overlap == "backward"
    r = trial.result
    assert r["step_period_s"] == {"forward": pytest.approx(0.0805), "backward": pytest.approx(0.077)}
    assert r["chosen"] == r["fastest"] == "backward" and r["baseline"] is None
    assert r["steps_counted"] == {"forward": 4, "backward": 5}
    assert r["paired"] is True and r["samples"] == {"forward": 2, "backward": 2}
    # MAD of forward's pairs 81, 80 ms is 0.5 ms: error 1.2533 * 1.4826 * 0.5 ms / sqrt(2)
    assert r["median_error_s"]["forward"] == pytest.approx(1.2533 * 1.4826 * 0.0005 / 2 ** 0.5)


def test_periods_that_alternate_are_judged_by_their_pairs():
    # forward overlap: each rank's periods alternate 68/103 ms (the job's pace 85.5 ms, steady);
    # DDP's schedule 89 ms +-1. Judged step by step the alternation looks like +-17 ms of noise
    # and the 3.5 ms lead is undecided through every pass; judged by pairs it is clear.
    trial = _three(steps=5, passes=3, confirm=False)
    fwd = [0.068, 0.103, 0.068, 0.103, 0.068, 0.103, 0.068, 0.103]
    ddp = [0.089, 0.090, 0.088, 0.089, 0.090, 0.088, 0.089, 0.089, 0.090]
    bwd = [0.095] * 8
    t = 0.5
    _run(trial, [t] + fwd[:4] + [t] + bwd[:4] + [t] + ddp + [t] + bwd[4:] + [t] + fwd[4:])
    r = trial.result
    assert r is not None and r["passes"] == 1 and r["chosen"] == "forward", r
    assert r["step_period_s"]["forward"] == pytest.approx(0.0855)


def test_a_lead_within_the_noise_keeps_the_baseline():
    medians = {"caramel/forward": 0.150, "caramel/backward": 0.164, "fifo/backward": 0.157}
    noisy = {"caramel/forward": 0.006, "caramel/backward": 0.006, "fifo/backward": 0.006}
    quiet = {"caramel/forward": 0.001, "caramel/backward": 0.001, "fifo/backward": 0.001}
    assert choose(medians) == "caramel/forward"
    assert choose(medians, noisy, ["fifo/backward"]) == "fifo/backward"   # 7 ms lead, 2 x 8.5 ms noise
    assert choose(medians, quiet, ["fifo/backward"]) == "caramel/forward"  # 7 ms lead, 2 x 1.4 ms noise
    assert choose({"fifo/backward": 0.1, "caramel/forward": 0.2}, quiet, ["fifo/backward"]) == "fifo/backward"


def test_the_baseline_is_the_planners_backward_mode_run_by_the_engine():
    # DDP's schedule, handed to torch DDP, pays its search for unused parameters; it is adopted
    # only when clearly the fastest
    names = ["caramel/forward", "caramel/backward", "fifo/backward"]
    assert trial_baseline(names, "caramel") == "caramel/backward"
    # the fifo planner's backward candidate is DDP's schedule itself
    assert trial_baseline(["fifo/forward", "fifo/backward"], "fifo") == "fifo/backward"
    assert trial_baseline(["caramel/forward"], "caramel") is None
    medians = {"caramel/forward": 0.0581, "caramel/backward": 0.0586, "fifo/backward": 0.0641}
    noisy = {"caramel/forward": 0.003, "caramel/backward": 0.003, "fifo/backward": 0.003}
    pref = trial_preference(list(medians), "caramel")
    assert pref == ["caramel/backward", "caramel/forward", "fifo/backward"]
    assert choose(medians, noisy, pref) == "caramel/backward"
    assert choose({**medians, "fifo/backward": 0.040}, noisy, pref) == "fifo/backward"
    # the fifo planner: its backward plan is DDP's schedule, and the baseline
    assert trial_preference(["fifo/forward", "fifo/backward"], "fifo") == ["fifo/backward", "fifo/forward"]
    # a plan the user gave: its candidates are named plan/...; without a backward candidate there
    # is no baseline, and the fastest wins outright
    assert trial_preference(["plan/forward", "plan/backward"], "plan") == ["plan/backward", "plan/forward"]
    assert trial_preference(["caramel/forward"], "caramel") == []


def test_the_baseline_is_the_plan_the_simulator_predicts_fastest():
    names = ["caramel/forward", "caramel/backward", "fifo/backward"]
    # forward predicted faster: it is the baseline, and a tie within the noise keeps it
    predicted = {"caramel/forward": 0.0883, "caramel/backward": 0.1049, "fifo/backward": None}
    pref = trial_preference(names, "caramel", predicted)
    assert pref == ["caramel/forward", "caramel/backward", "fifo/backward"]
    medians = {"caramel/forward": 0.1039, "caramel/backward": 0.1072, "fifo/backward": 0.1222}
    noisy = {"caramel/forward": 0.002, "caramel/backward": 0.002, "fifo/backward": 0.002}
    assert choose(medians, noisy, pref) == "caramel/forward"
    # ... and a clear measured lead still beats the prediction
    assert choose({**medians, "caramel/backward": 0.090}, noisy, pref) == "caramel/backward"
    # backward predicted faster, as fast, or slower by less than PREDICTED_TIE (3%): backward
    assert PREDICTED_TIE == 0.03
    assert trial_baseline(names, "caramel", {**predicted, "caramel/backward": 0.080}) == "caramel/backward"
    assert trial_baseline(names, "caramel", {**predicted, "caramel/backward": 0.0883}) == "caramel/backward"
    # (two plans that hide all their communication, predicted alike up to rounding)
    assert trial_baseline(names, "caramel", {**predicted, "caramel/forward": 0.03994320086433033,
                                             "caramel/backward": 0.039943200864330335}) == "caramel/backward"
    assert trial_baseline(names, "caramel", {**predicted, "caramel/backward": 0.0883 * 1.029}) == "caramel/backward"
    assert trial_baseline(names, "caramel", {**predicted, "caramel/backward": 0.0883 * 1.031}) == "caramel/forward"
    # DDP's schedule is never the baseline of another planner, whatever its prediction
    assert trial_baseline(names, "caramel", {**predicted, "fifo/backward": 0.01}) == "caramel/forward"
    # a plan without a prediction: the backward plan, as without predictions at all
    assert trial_baseline(names, "caramel", {**predicted, "caramel/backward": None}) == "caramel/backward"
    assert trial_baseline(names, "caramel", None) == "caramel/backward"
    # the fifo planner's own plans, predicted: its forward plan can be the baseline too
    assert trial_preference(["fifo/forward", "fifo/backward"], "fifo",
                            {"fifo/forward": 0.1, "fifo/backward": 0.2}) == ["fifo/forward", "fifo/backward"]
    # without a backward candidate there is still no baseline
    assert trial_preference(["caramel/forward"], "caramel", {"caramel/forward": 0.1}) == []


def test_a_tie_with_the_fastest_goes_to_the_more_preferred():
    # DDP's schedule fastest by 0.2 ms over forward, both clearly ahead of backward (the
    # baseline): forward is the most preferred candidate within the noise of the fastest
    medians = {"caramel/forward": 0.1463, "caramel/backward": 0.1571, "fifo/backward": 0.1461}
    errors = {"caramel/forward": 0.002, "caramel/backward": 0.002, "fifo/backward": 0.002}
    pref = trial_preference(list(medians), "caramel")
    assert choose(medians, errors, pref) == "caramel/forward"
    # DDP's schedule clearly ahead of both: it wins
    assert choose({**medians, "fifo/backward": 0.130}, errors, pref) == "fifo/backward"
    # forward within the noise of the fastest and backward too: backward, first in preference
    assert choose({**medians, "caramel/backward": 0.149}, errors, pref) == "caramel/backward"


def test_three_candidates_run_in_mirrored_blocks():
    cands = _cands() + [Candidate("fifo/backward", "backward", plan=object())]  # type: ignore[arg-type]
    trial = OverlapTrial(cands, steps=2, group=None, world=1, preference=["fifo/backward"])
    assert trial.blocks == [(0, 2), (1, 2), (2, 4), (1, 2), (0, 2)]
    out = _run(trial, [0.1, 0.05] + [0.1, 0.06] + [0.1, 0.04, 0.041, 0.042] + [0.1, 0.061] + [0.1, 0.051])
    assert [c.name if c else None for c in out] == [None, "backward", None, "fifo/backward", None, None, None,
                                                     "backward", None, "forward", None, "fifo/backward"]
    assert trial.result["chosen"] == "fifo/backward"
    assert trial.result["steps_counted"] == {"forward": 2, "backward": 2, "fifo/backward": 3}
    # one counted step per block for two of them: every candidate is judged period by period
    # (pairs for DDP's schedule alone would leave it one sample and an infinite error)
    assert trial.result["paired"] is False
    assert trial.result["samples"] == trial.result["steps_counted"]
    assert trial.result["median_error_s"]["fifo/backward"] < float("inf")


def _three(steps: int = 2, passes: int = 3, confirm: bool = True) -> OverlapTrial:
    """forward, backward and DDP's schedule, the baseline (as with the fifo planner)"""
    cands = _cands() + [Candidate("fifo/backward", "backward", plan=object())]  # type: ignore[arg-type]
    return OverlapTrial(cands, steps=steps, group=None, world=1, preference=["fifo/backward", "forward", "backward"],
                        max_passes=passes, confirm=confirm, sized=True)


def _pass(trial: OverlapTrial, fwd: list[float], bwd: list[float], ddp: list[float]) -> list:
    """One pass of blocks A, B, CC, B, A with steps=3: each list holds a candidate's counted periods in order."""
    t = 0.5  # a transition step, not counted
    return _run(trial, [t] + fwd[:2] + [t] + bwd[:2] + [t] + ddp[:5] + [t] + bwd[2:4] + [t] + fwd[2:4])


def test_an_undecided_lead_runs_another_pass_and_a_clear_one_ends_the_trial():
    trial = _three(steps=3, passes=3, confirm=False)
    # forward leads DDP's schedule by 2 ms in noise of +-10 ms: undecided, a second pass begins
    out = _pass(trial, [0.10, 0.12, 0.09, 0.11], [0.13, 0.14, 0.13, 0.15], [0.09, 0.13, 0.11, 0.12, 0.115])
    assert trial.result is None and trial.passes == 2 and out[-1].name == "forward"
    assert len(trial.blocks) == 10
    # second pass: forward steadily at 90 ms, DDP's schedule at 120 ms: pooled, the lead is clear
    out = _pass(trial, [0.09] * 4, [0.13] * 4, [0.12] * 5)
    r = trial.result
    assert r["passes"] == 2 and r["chosen"] == "forward" and out[-1].name == "forward"
    assert r["steps_counted"] == {"forward": 8, "backward": 8, "fifo/backward": 10}


def test_a_lead_still_within_the_noise_after_the_last_pass_keeps_ddps_schedule():
    trial = _three(steps=3, passes=2)
    noisy = ([0.10, 0.12, 0.09, 0.11], [0.13, 0.14, 0.13, 0.15], [0.09, 0.13, 0.11, 0.12, 0.115])
    _pass(trial, *noisy)
    out = _pass(trial, *noisy)
    assert trial.result["passes"] == 2 and trial.result["chosen"] == "fifo/backward"
    assert trial.result["fastest"] == "forward" and out[-1].name == "fifo/backward"


def test_ddps_schedule_in_front_ends_the_trial_after_one_pass():
    trial = _three(steps=3, passes=3)
    out = _pass(trial, [0.12] * 4, [0.13] * 4, [0.10, 0.11, 0.09, 0.10, 0.10])
    assert trial.result["passes"] == 1 and out[-1].name == "fifo/backward"


def _confirm(trial: OverlapTrial, first: list[float], middle: list[float], last: list[float]) -> list:
    """The confirmation's blocks X, YY, X with steps=3: each list holds one block's counted periods."""
    t = 0.5  # a transition step, not counted
    return _run(trial, [t] + first + [t] + middle + [t] + last)


def test_a_winner_other_than_the_baseline_must_win_again_on_fresh_steps():
    # forward leads the baseline (DDP's schedule here) clearly in the pass; the confirmation
    # then runs forward, DDP's schedule, forward (forward ran last, so it goes first)
    trial = _three(steps=3, passes=3)
    out = _pass(trial, [0.09] * 4, [0.13] * 4, [0.12] * 5)
    assert trial.result is None and trial.selection["chosen"] == "forward" and out[-1].name == "forward"
    assert trial.blocks[-3:] == [(0, 3), (2, 6), (0, 3)]
    # on the fresh steps forward is steadily faster: adopted
    out = _confirm(trial, [0.091, 0.089], [0.121, 0.119, 0.120, 0.122, 0.118], [0.090, 0.092])
    r = trial.result
    assert out[-1].name == "forward" and r["chosen"] == "forward" and r["passes"] == 1
    assert r["confirmation"]["confirmed"] is True and r["confirmation"]["candidate"] == "forward"
    assert r["confirmation"]["step_period_s"] == {"forward": pytest.approx(0.0905), "fifo/backward": pytest.approx(0.1205)}
    # what the pass measured stays in the result, every candidate's
    assert r["step_period_s"]["backward"] == pytest.approx(0.13)


def test_a_lead_the_fresh_steps_do_not_repeat_keeps_the_baseline():
    # the winner's curse: DDP's schedule and backward (the baseline) are alike; in the pass the
    # challenger drew its fast steps and looked clearly ahead; fresh steps show them level
    cands = _cands() + [Candidate("fifo/backward", "backward", plan=object())]  # type: ignore[arg-type]
    trial = OverlapTrial(cands, steps=3, group=None, world=1, preference=["backward", "forward", "fifo/backward"],
                         max_passes=3)
    out = _pass(trial, [0.15] * 4, [0.131, 0.129, 0.130, 0.132], [0.120, 0.121, 0.119, 0.120, 0.121])
    assert trial.result is None and trial.selection["chosen"] == "fifo/backward"
    # forward ran last, neither of the two: the challenger goes first
    assert trial.blocks[-3:] == [(2, 3), (1, 6), (2, 3)] and out[-1].name == "fifo/backward"
    out = _confirm(trial, [0.131, 0.135], [0.131, 0.127, 0.133, 0.129, 0.130], [0.130, 0.134])
    r = trial.result
    assert r["chosen"] == "backward" and out[-1].name == "backward"
    assert r["confirmation"]["confirmed"] is False and r["confirmation"]["candidate"] == "fifo/backward"
    assert r["confirmation"]["step_period_s"] == {"fifo/backward": pytest.approx(0.1325), "backward": pytest.approx(0.130)}


def test_the_confirmation_asks_for_the_direction_not_for_a_clear_lead_again():
    # forward clearly ahead in the pass; on the fresh steps still ahead (69.8 against 74.8 ms)
    # but by less than twice the noise of so few steps: confirmed all the same
    trial = _three(steps=3, passes=3)
    _pass(trial, [0.067] * 4, [0.075] * 4, [0.084] * 5)
    assert trial.selection["chosen"] == "forward"
    _confirm(trial, [0.060, 0.066], [0.066, 0.086, 0.064, 0.084, 0.075], [0.074, 0.079])
    r = trial.result
    conf = r["confirmation"]
    lead = conf["step_period_s"]["fifo/backward"] - conf["step_period_s"]["forward"]
    noise = (conf["median_error_s"]["forward"] ** 2 + conf["median_error_s"]["fifo/backward"] ** 2) ** 0.5
    assert 0 < lead < 2 * noise, conf
    assert r["chosen"] == "forward" and conf["confirmed"] is True


def test_the_confirmation_starts_with_the_baseline_when_it_ran_last():
    # blocks A, BB, A with the baseline as A: it is the one running when the pass ends
    cands = [Candidate("backward", "backward", plan=object()), Candidate("forward", "forward", plan=object())]  # type: ignore[arg-type]
    trial = OverlapTrial(cands, steps=3, group=None, world=1, preference=["backward", "forward"])
    t = 0.5
    out = _run(trial, [t, 0.10, 0.10] + [t] + [0.08] * 5 + [t, 0.10, 0.10])
    assert trial.selection["chosen"] == "forward" and trial.blocks[-3:] == [(0, 3), (1, 6), (0, 3)]
    assert out[-1].name == "backward"


def test_no_confirmation_without_a_baseline_or_when_switched_off():
    trial = OverlapTrial(_cands(), steps=3, group=None, world=1)
    _run(trial, [0.5, 0.08, 0.08] + [0.5] + [0.07] * 5 + [0.5, 0.08, 0.08])
    assert trial.result["chosen"] == "backward" and trial.result["confirmation"] is None
    trial = _three(steps=3, passes=3, confirm=False)
    out = _pass(trial, [0.09] * 4, [0.13] * 4, [0.12] * 5)
    assert trial.result["chosen"] == "forward" and trial.result["confirmation"] is None and out[-1].name == "forward"


def test_a_single_fast_outlier_does_not_win():
    trial = OverlapTrial(_cands(), steps=4, group=None, world=1)
    out = _run(trial, [0.2, 0.060, 0.061, 0.062] + [0.2, 0.010, 0.090, 0.091, 0.092, 0.089, 0.090, 0.093]
               + [0.2, 0.063, 0.059, 0.060])
    assert out[-1].overlap == "forward" and trial.result["chosen"] == "forward"


def test_trial_needs_a_counted_step():
    with pytest.raises(AssertionError):
        OverlapTrial(_cands(), steps=1, group=None, world=1)


def test_parallelize_rejects_bad_trial_settings():
    import torch

    import caramel
    from caramel.errors import CaramelError

    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(CaramelError, match="trial_steps"):
        caramel.parallelize(m, opt, trial_steps=1)
    with pytest.raises(CaramelError, match="trial_passes"):
        caramel.parallelize(m, opt, trial_passes=0)
    with pytest.raises(CaramelError, match="overlap must be one of auto"):
        caramel.parallelize(m, opt, overlap="sometimes")


def test_a_step_without_a_period_takes_its_place_but_adds_no_sample():
    # a run resumed inside a block: its first step has no period (None), so it is not counted
    trial = OverlapTrial(_cands(), steps=3, group=None, world=1)
    trial.block, trial.in_block = 0, 1
    assert _run(trial, [None, 0.080]) == [None, trial.candidates[1]]
    assert trial.candidates[0].blocks_s == [[0.080]]
    trial.block, trial.in_block = 1, 1  # the block's first counted step opens its list
    _run(trial, [None, 0.070])
    assert trial.candidates[1].blocks_s == [[0.070]]


def test_the_result_records_the_blocks_as_run_with_their_steps():
    # two passes (an undecided lead, then a clear one) and a confirmation, from step 7 on (the
    # engine's count: the trial's first step is the 7th); the record must cover every trial
    # step once, in the order the trial switched, and end at the step after which the chosen
    # candidate is adopted
    trial = _three(steps=3, passes=3)
    noisy = ([0.10, 0.12, 0.09, 0.11], [0.13, 0.14, 0.13, 0.15], [0.09, 0.13, 0.11, 0.12, 0.115])
    clear = ([0.09] * 4, [0.13] * 4, [0.12] * 5)
    t = 0.5
    periods = [p for fwd, bwd, ddp in (noisy, clear)
               for p in [t] + fwd[:2] + [t] + bwd[:2] + [t] + ddp + [t] + bwd[2:] + [t] + fwd[2:]]
    periods += [t, 0.091, 0.089, t, 0.121, 0.119, 0.120, 0.122, 0.118, t, 0.090, 0.092]
    step, out = 6, []
    for p in periods:
        step += 1
        out.append(trial.record(p, step=step))
        if trial.result is not None:
            break
    r = trial.result
    assert r is not None and r["chosen"] == "forward" and r["confirmation"]["confirmed"], r
    assert step == 6 + len(periods) and out[-1].name == "forward"
    blocks = r["blocks"]
    assert [b[0] for b in blocks] == [trial.candidates[i].name for i, _ in trial.blocks]
    assert [b[2] - b[1] + 1 for b in blocks] == [n for _, n in trial.blocks]
    assert blocks[0][1] == r["start_step"] == 7 and blocks[-1][2] == r["end_step"] == step
    assert all(b[1] == a[2] + 1 for a, b in zip(blocks, blocks[1:])), blocks
    # the second pass starts with the candidate the first ended with: still two blocks
    assert blocks[4][0] == blocks[5][0] == "forward" and blocks[5][1] == blocks[4][2] + 1
    assert r["complete"] is True
    # without step counts nothing is recorded, and the result says so
    bare = OverlapTrial(_cands(), steps=2, group=None, world=1)
    _run(bare, [t, 0.08, t, 0.07, 0.07, 0.07, t, 0.08])
    assert bare.result["blocks"] == [] and bare.result["start_step"] is None and bare.result["end_step"] is None
    assert bare.result["complete"] is False


def test_a_resume_inside_a_block_without_a_record_records_from_the_resume_and_says_so():
    # a checkpoint written before the record (`ran` empty) taken after block 1's first step: the
    # record starts at the resume, with a fragment of block 1, and the result is marked incomplete
    trial = OverlapTrial(_cands(), steps=2, group=None, world=1)
    assert trial.blocks == [(0, 2), (1, 4), (0, 2)]
    trial.block, trial.in_block = 1, 1
    trial.candidates[0].blocks_s = [[0.080]]
    for step, p in zip(range(41, 46), [None, 0.07, 0.07, 0.5, 0.08]):
        nxt = trial.record(p, step=step)
    r = trial.result
    assert r is not None and nxt is not None and nxt.name == r["chosen"]
    assert r["blocks"] == [["backward", 41, 43], ["forward", 44, 45]], r["blocks"]
    assert r["start_step"] == 41 and r["end_step"] == 45 and r["complete"] is False


def test_the_trial_counts_steps_as_the_balancer_does():
    # after a resume that does not carry the plan, trial or profiling on, the engine counts from 0
    # again while the balancer's count is restored: the trial must number its blocks as the
    # balancer numbers its share changes
    from types import SimpleNamespace

    from caramel.strategies.caramel.balance import Balancer
    from caramel.strategies.caramel.controller import Controller

    trial = OverlapTrial(_cands(), steps=3, group=None, world=1)  # the first block outlasts the two steps
    balancer = Balancer.__new__(Balancer)  # only its count is read
    balancer._steps = 103
    engine = SimpleNamespace(stats=SimpleNamespace(last_step_s=0.5, step=3))
    Controller._trial_step_end(SimpleNamespace(trial=trial, balancer=balancer, engine=engine))
    assert trial.ran == [["forward", 103, 103]]
    Controller._trial_step_end(SimpleNamespace(trial=trial, balancer=None, engine=engine))  # none: the engine's
    assert trial.ran == [["forward", 103, 3]]
