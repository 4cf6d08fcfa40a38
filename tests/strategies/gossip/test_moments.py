"""The debiased second moment (`second_moment=debiased`) in one process: torch's Adam and AdamW
land on the estimate in every implementation, and the inputs it cannot serve are refused."""
from __future__ import annotations

import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies import STRATEGIES
from caramel.strategies.gossip.moments import SecondMoment
from caramel.strategies.gossip.parallelize import _check_optimizer


@pytest.mark.parametrize("kind", [dict(cls=torch.optim.AdamW, foreach=False), dict(cls=torch.optim.AdamW, foreach=True),
                                  dict(cls=torch.optim.Adam, foreach=False, amsgrad=True, maximize=True),
                                  dict(cls=torch.optim.Adam, foreach=True, weight_decay=0.3, decoupled_weight_decay=True)])
def test_the_optimizer_steps_with_the_estimate(kind):
    """Three steps on given gradients, n = 4: exp_avg_sq is A/4 + 3/4 max(C, 0) of the
    hand-computed A = EMA(g^2), C = EMA(g(t) m-hat(t-1)) (Adam's bias-corrected first moment
    before the step; g^2 at the first step), whatever torch's implementation (for-loop,
    foreach, amsgrad's running max, decoupled decay, maximize) does with it."""
    kw = dict(kind)
    cls = kw.pop("cls")
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    opt = cls([p], lr=0.1, betas=(0.9, 0.99), **kw)
    moments = SecondMoment([("p", p)], opt, world=4)
    grads = [torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([0.4, 1.5, -3.0, 0.1]), torch.tensor([0.6, -0.5, 1.0, 0.2])]
    A, C, m = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    clamped = False
    for t, g in enumerate(grads, 1):
        p.grad = g.clone()
        moments.observe()
        moments.set_up()
        opt.step()
        A = 0.99 * A + 0.01 * g * g
        C = 0.99 * C + 0.01 * g * (m / (1 - 0.9 ** (t - 1)) if t > 1 else g)
        m = 0.9 * m + 0.1 * g
        clamped |= bool((C < 0).any())
        v = A / 4 + 0.75 * C.clamp(min=0)
        assert torch.allclose(opt.state[p]["exp_avg_sq"], v, rtol=1e-6, atol=1e-9), (opt.state[p]["exp_avg_sq"], v)
    assert clamped  # the max(C, 0) is exercised
    assert not torch.allclose(v, A)  # and differs from the optimizer's own second moment


def test_options_and_optimizers_it_cannot_serve_are_refused():
    params = [torch.nn.Parameter(torch.zeros(2))]
    spec = lambda text: STRATEGIES.spec(text).options  # noqa: E731
    for algorithm in ("dpsgd", "overlap", "adam"):
        assert spec(f"gossip:algorithm={algorithm},second_moment=debiased").debiases
    assert not spec("gossip").debiases
    with pytest.raises(CaramelError, match="second_moment must be one of own, debiased, got 'ddp'"):
        spec("gossip:second_moment=ddp")
    with pytest.raises(CaramelError, match="algorithm=tracking steps with a tracker"):
        spec("gossip:algorithm=tracking,second_moment=debiased")
    with pytest.raises(CaramelError, match="algorithm=overlap_momentum mixes exp_avg_sq"):
        spec("gossip:algorithm=overlap_momentum,second_moment=debiased")
    with pytest.raises(CaramelError, match="head_steps"):
        STRATEGIES.spec("gossip:second_moment=debiased", {"personalize": "head", "head_steps": 2})
    deb = spec("gossip:second_moment=debiased")
    _check_optimizer(torch.optim.AdamW(params), deb)
    _check_optimizer(torch.optim.Adam(params), deb)
    _check_optimizer(torch.optim.Adam(params, weight_decay=0.1, decoupled_weight_decay=True), deb)
    with pytest.raises(CaramelError, match="pass torch.optim.Adam or AdamW, got SGD"):
        _check_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9), deb)
    with pytest.raises(CaramelError, match="weight_decay=0.1 is added to the gradient it squares"):
        _check_optimizer(torch.optim.Adam(params, weight_decay=0.1), deb)
    with pytest.raises(CaramelError, match="use differentiable=False"):
        _check_optimizer(torch.optim.Adam(params, differentiable=True), deb)


def _steps(opt, moments, p_grads):
    """One step per entry of `p_grads` ([(parameter, gradient or None)]), as GossipRun does it."""
    for pairs in p_grads:
        for p, g in pairs:
            p.grad = None if g is None else g.clone()
        moments.observe()
        moments.set_up()
        opt.step()


def _v(grads, betas, n):
    """The hand-computed v of one parameter after `grads` (None: no step for it)."""
    b1, b2 = betas
    A, C, m, t = 0.0, 0.0, 0.0, 0
    for g in grads:
        if g is None:
            continue
        t += 1
        A = b2 * A + (1 - b2) * g * g
        C = b2 * C + (1 - b2) * g * (m / (1 - b1 ** (t - 1)) if t > 1 else g)
        m = b1 * m + (1 - b1) * g
    return A / n + (1 - 1 / n) * C.clamp(min=0)


@pytest.mark.parametrize("fused", [False, True])
def test_each_group_its_own_betas_and_steps_without_a_gradient_skipped(fused):
    """Two groups with different betas; the second group's parameter gets no gradient on step 2:
    each lands on its own v, counted over the steps it had (A and C do not decay without a
    gradient, as Adam's moments do not). fused=True: torch's fused CPU AdamW."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    q = torch.nn.Parameter(torch.tensor([0.3, 0.7, -1.0]))
    opt = torch.optim.AdamW([{"params": [p]}, {"params": [q], "betas": (0.8, 0.9)}], lr=0.1, betas=(0.9, 0.99),
                            fused=fused)
    moments = SecondMoment([("p", p), ("q", q)], opt, world=4)
    gp = [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.4, 1.5, -3.0]), torch.tensor([0.6, -0.5, 1.0])]
    gq = [torch.tensor([1.0, 0.2, -0.4]), None, torch.tensor([-2.0, 0.3, 0.5])]
    _steps(opt, moments, [[(p, a), (q, b)] for a, b in zip(gp, gq)])
    assert torch.allclose(opt.state[p]["exp_avg_sq"], _v(gp, (0.9, 0.99), 4), rtol=1e-6, atol=1e-9)
    assert torch.allclose(opt.state[q]["exp_avg_sq"], _v(gq, (0.8, 0.9), 4), rtol=1e-6, atol=1e-9)


def test_a_changing_beta2_is_read_at_each_step():
    """A beta2 warm-up (0.95 -> 0.999 at step 3): v follows the group's current betas, stays
    positive, and the parameters stay finite."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(1000))
    opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95))
    moments = SecondMoment([("p", p)], opt, world=8)
    A, C, m = torch.zeros(1000), torch.zeros(1000), torch.zeros(1000)
    for t in range(1, 7):
        if t == 3:
            opt.param_groups[0]["betas"] = (0.9, 0.999)
        b1, b2 = opt.param_groups[0]["betas"]
        g = torch.randn(1000) * (10.0 if t == 4 else 1.0)
        _steps(opt, moments, [[(p, g)]])
        A = b2 * A + (1 - b2) * g * g
        C = b2 * C + (1 - b2) * g * (m if t > 1 else g)
        m_hat_den = 1 - b1 ** t
        m = (b1 * m * (1 - b1 ** (t - 1)) + (1 - b1) * g) / m_hat_den  # m-hat after step t
        v = A / 8 + (7 / 8) * C.clamp(min=0)
        assert torch.allclose(opt.state[p]["exp_avg_sq"], v, rtol=1e-5, atol=1e-9)
    assert (opt.state[p]["exp_avg_sq"] >= 0).all() and torch.isfinite(p).all()


def test_a_parameter_outside_the_optimizer_is_skipped():
    """A model parameter with a gradient that the optimizer does not hold: left alone, as Adam does."""
    p, q = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([q], lr=0.1)
    moments = SecondMoment([("p", p), ("q", q)], opt, world=2)
    _steps(opt, moments, [[(p, torch.ones(2)), (q, torch.ones(2))]] * 2)
    assert moments.names == ["q"] and torch.equal(p.detach(), torch.ones(2)) and p not in opt.state


def test_a_resume_without_the_estimate_and_a_foreign_state_are_refused():
    """optimizer.state_dict() alone carries Adam's step count but not A and C: the next step is
    an error naming worker_state(); the estimate's own state restores it; a state for other
    parameter names, without the "sq"/"cross" mappings or of another shape is an error naming
    what is wrong."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    moments = SecondMoment([("w", p)], opt, world=2)
    _steps(opt, moments, [[(p, torch.tensor([1.0, -1.0, 2.0]))]] * 3)
    saved_opt, saved = opt.state_dict(), moments.state_dict()
    q = torch.nn.Parameter(torch.ones(3))
    opt2 = torch.optim.AdamW([q], lr=0.1)
    opt2.load_state_dict(saved_opt)
    fresh = SecondMoment([("w", q)], opt2, world=2)
    q.grad = torch.ones(3)
    with pytest.raises(CaramelError, match="'w' has 3 Adam steps but its second-moment estimate has 0.*worker_state"):
        fresh.observe()
    fresh.load_state_dict(saved)
    fresh.observe()  # the counts agree again
    with pytest.raises(CaramelError, match="no parameter 'w'"):
        SecondMoment([("w", q)], opt2, world=2).load_state_dict({"sq": {"v": q}, "cross": {"v": q}})
    with pytest.raises(CaramelError, match="no 'cross' mapping"):
        SecondMoment([("w", q)], opt2, world=2).load_state_dict({"sq": {"w": q}})
    with pytest.raises(CaramelError, match=r"'sq' of parameter 'w' is \(2,\), expected a tensor of shape \(3,\)"):
        SecondMoment([("w", q)], opt2, world=2).load_state_dict({"sq": {"w": torch.ones(2)}, "cross": {"w": q}})


def test_a_closure_is_refused():
    """step(closure) would compute a new gradient after exp_avg_sq was set up for the old one."""
    from types import SimpleNamespace
    from caramel.strategies.gossip.wrappers import wrap_optimizer
    p = torch.nn.Parameter(torch.ones(2))
    run = SimpleNamespace(tracker=None, options=SimpleNamespace(mixes_at_update=False), moments=object())
    opt = wrap_optimizer(torch.optim.AdamW([p]), run)
    with pytest.raises(CaramelError, match="second_moment=debiased sets exp_avg_sq.*without a closure"):
        opt.step(lambda: None)
