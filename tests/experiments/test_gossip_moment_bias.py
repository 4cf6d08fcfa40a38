"""experiments/gossip_moment_bias.py's estimator on cases with a known answer: no noise (every
worker's gradient the same, constant in time: C is mu^2 and v is DDP's O), an alternating
gradient (C below zero: the clamp makes v fall to A/n), and windows that must cover every step."""
import sys

import pytest
import torch


def _script():
    from experiments import gossip_moment_bias
    return gossip_moment_bias


def _moments(n, shapes):
    zeros = lambda: [torch.zeros(s) for s in shapes]  # noqa: E731
    return [zeros() for _ in range(n)], [zeros() for _ in range(n)], [zeros() for _ in range(n)], zeros()


def _replay(n, grad_at, steps=60, b1=0.9, b2=0.999):
    A, C, M, O = _moments(n, [g.shape for g in grad_at(1)])
    for t in range(1, steps + 1):
        _script().update_moments(A, C, M, O, [grad_at(t) for _ in range(n)], t, b1, b2)
    return _script().ratios(A, C, O)


def test_without_noise_the_cross_term_is_the_squared_mean_gradient():
    torch.manual_seed(0)
    g = [torch.randn(3, 4), torch.randn(5)]
    for v_over_ddp, clamped, unclamped in _replay(4, lambda t: g):
        assert (v_over_ddp, clamped, unclamped) == pytest.approx((1.0, 1.0, 1.0), rel=1e-4)


def test_a_gradient_that_turns_each_step_has_a_negative_cross_term():
    torch.manual_seed(0)
    g = [torch.randn(6)]
    n = 4
    for v_over_ddp, clamped, unclamped in _replay(n, lambda t: [x * (-1) ** t for x in g]):
        assert unclamped < 0 and clamped == 0.0
        assert v_over_ddp == pytest.approx(1 / n, rel=1e-4)  # v = A/n: every worker sees the same g, so A = O


@pytest.mark.parametrize("window", ["35", "50", "480"])
def test_windows_that_leave_steps_out_are_refused(monkeypatch, window):
    monkeypatch.setattr(sys, "argv", ["gossip_moment_bias.py", "--window-steps", window])
    with pytest.raises(SystemExit, match=f"--window-steps {window}: expected a multiple of 5 that divides the 240"):
        _script().main()
