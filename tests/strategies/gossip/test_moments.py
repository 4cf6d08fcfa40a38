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
