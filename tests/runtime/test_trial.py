"""The overlap trial's bookkeeping and choice, on recorded step periods (one process)."""
import pytest

from caramel.runtime.trial import Candidate, OverlapTrial, choose


def _cands() -> list[Candidate]:
    # the plans are not looked at by the trial; any object stands in
    return [Candidate("forward", plan=object()), Candidate("backward", plan=object())]  # type: ignore[arg-type]


def test_choose_takes_the_fastest_and_the_first_on_a_tie():
    assert choose({"forward": 0.090, "backward": 0.077}) == "backward"
    assert choose({"forward": 0.070, "backward": 0.077}) == "forward"
    assert choose({"forward": 0.077, "backward": 0.077}) == "forward"


def test_trial_runs_each_candidate_then_picks_the_faster_median_without_the_transition_step():
    trial = OverlapTrial(_cands(), steps=4, group=None, world=1)
    # forward: a slow transition step (not counted), then 80, 82, 81 ms
    for t in (0.500, 0.080, 0.082):
        assert trial.record(t) is None
    nxt = trial.record(0.081)
    assert nxt is not None and nxt.overlap == "backward" and trial.result is None
    # backward: transition, then 70, 95, 71 ms: median 71 ms beats 81 ms
    for t in (0.300, 0.070, 0.095):
        assert trial.record(t) is None
    winner = trial.record(0.071)
    assert winner.overlap == "backward"
    assert trial.result == {"step_period_s": {"forward": pytest.approx(0.081), "backward": pytest.approx(0.071)},
                            "chosen": "backward", "steps_per_candidate": 4}


def test_a_single_fast_outlier_does_not_win():
    trial = OverlapTrial(_cands(), steps=4, group=None, world=1)
    for t in (0.2, 0.060, 0.061, 0.062):
        trial.record(t)
    for t in (0.2, 0.010, 0.090, 0.091):  # one implausibly fast step, median 90 ms
        out = trial.record(t)
    assert out.overlap == "forward"


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
    with pytest.raises(CaramelError, match="overlap must be one of auto"):
        caramel.parallelize(m, opt, overlap="sometimes")
