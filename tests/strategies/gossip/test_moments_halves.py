"""`second_moment=debiased,cross_term=halves` in one process: the cross term from two half-batch
backward passes is unbiased for mu^2 at the same step (where the first moment's and g^2 are not),
equals 4 a b by hand (rescaled with p.grad), and a step without exactly two backward passes or
a bad option is refused."""
from __future__ import annotations

import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies import STRATEGIES
from caramel.strategies.gossip.moments import SecondMoment


def _backward(p: torch.Tensor, half_grad: torch.Tensor) -> None:
    """One half's backward: its mean-loss gradient `half_grad`, halved (as `caramel train` does)."""
    (p * (half_grad / 2)).sum().backward()


def _cross_increments(cross_term: str, steps: int, coords: int, seed: int) -> tuple[float, float, float]:
    """Mean over steps and coordinates of what each step folds into C (recovered from the EMA),
    of mu^2, and of g^2 (the optimizer's own input), on a synthetic problem whose mean gradient
    flips sign every step (mu_t = +-0.5 per coordinate) and whose half-batch gradients carry
    independent noise of SD 1: E[g^2] = mu^2 + 1/2, and the first moment of earlier steps points
    the other way."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.zeros(coords))
    b2 = 0.5
    opt = torch.optim.AdamW([p], lr=0.0, betas=(0.9, b2), weight_decay=0.0)
    moments = SecondMoment([("p", p)], opt, world=4, cross_term=cross_term)
    sign = torch.where(torch.rand(coords, generator=gen) < 0.5, -1.0, 1.0)
    inc, mu_sq, g_sq = [], [], []
    before = torch.zeros(coords)
    for t in range(steps):
        mu = 0.5 * sign * (-1.0) ** t
        h1, h2 = (mu + torch.randn(coords, generator=gen) for _ in range(2))
        p.grad = None
        _backward(p, h1)
        _backward(p, h2)
        moments.observe()
        moments.set_up()
        opt.step()
        after = moments.cross[0].clone()
        if t:  # step 1 of first_moment has no earlier gradient: its input is g^2
            inc.append(float(((after - b2 * before) / (1 - b2)).mean()))
            mu_sq.append(float((mu * mu).mean()))
            g_sq.append(float((((h1 + h2) / 2) ** 2).mean()))
        before = after
    return sum(inc) / len(inc), sum(mu_sq) / len(mu_sq), sum(g_sq) / len(g_sq)


def test_the_halves_cross_term_is_unbiased_for_the_squared_mean_at_the_same_step():
    """2e5 products (SD about 1.2 each: SE about 0.003): the halves' mean lands on mu^2 = 0.25
    within 0.02; g^2 (mean 0.75) and the first moment's partner (the mean gradient turns every
    step: negative) miss it by far more, so an estimator using either fails this test."""
    halves, mu_sq, g_sq = _cross_increments("halves", steps=11, coords=20000, seed=0)
    assert mu_sq == pytest.approx(0.25)
    assert abs(halves - mu_sq) < 0.02, (halves, mu_sq)
    assert g_sq - mu_sq > 0.4, g_sq  # what the optimizer's own v averages
    first, _, _ = _cross_increments("first_moment", steps=11, coords=20000, seed=0)
    assert first < 0.0, first  # the previous session's estimator, biased here


def test_the_cross_term_is_four_a_b_and_follows_a_rescaled_gradient():
    """Given halves a and b (what each backward adds), C's input is 4 a b; clipping p.grad by a
    factor c between backward and step() scales it by c^2 (the product of the halves the
    optimizer steps with); A gets the rescaled gradient."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=0.0, betas=(0.9, 0.99))
    moments = SecondMoment([("p", p)], opt, world=4, cross_term="halves")
    h1, h2 = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 1.0, 0.5])
    a, b = h1 / 2, h2 / 2
    _backward(p, h1)
    _backward(p, h2)
    moments.observe()
    assert torch.allclose(moments.cross[0], 0.01 * 4 * a * b)
    assert torch.allclose(moments.sq[0], 0.01 * (a + b) ** 2)
    moments.set_up()
    opt.step()
    p.grad = None
    _backward(p, h1)
    _backward(p, h2)
    p.grad.mul_(0.3)  # clip_grad_norm_'s factor
    moments.observe()
    assert torch.allclose(moments.cross[0], 0.99 * 0.01 * 4 * a * b + 0.01 * 0.09 * 4 * a * b)
    assert torch.allclose(moments.sq[0], 0.99 * 0.01 * (a + b) ** 2 + 0.01 * 0.09 * (a + b) ** 2)
    moments.set_up()
    v = moments.sq[0] / 4 + 0.75 * moments.cross[0].clamp(min=0)
    opt.step()
    assert torch.allclose(opt.state[p]["exp_avg_sq"], v, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("passes", [1, 3])
def test_a_step_without_exactly_two_backward_passes_is_refused(passes):
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=0.1)
    moments = SecondMoment([("w", p)], opt, world=2, cross_term="halves")
    for _ in range(passes):
        _backward(p, torch.ones(2))
    with pytest.raises(CaramelError, match=f"parameter 'w' got {passes}.*exactly twice"):
        moments.observe()


def test_a_parameter_one_half_or_neither_half_reaches_folds_a_zero_product():
    """A branch taken by one half only (q) got nothing from the other: its b is exactly 0, so C's
    input is 0 (the estimator's own value, not an error); a parameter neither half reaches with a
    zeroed p.grad (r, zero_grad(set_to_none=False)) folds 0 too; p, in both halves, folds 4 a b."""
    p, q, r = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    opt = torch.optim.AdamW([p, q, r], lr=0.0, betas=(0.9, 0.5))
    moments = SecondMoment([("p", p), ("q", q), ("r", r)], opt, world=2, cross_term="halves")
    r.grad = torch.zeros(2)
    h1, h2, hq = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 1.0]), torch.tensor([2.0, -4.0])
    ((p * h1 / 2).sum() + (q * hq / 2).sum()).backward()  # the first half takes q's branch
    (p * h2 / 2).sum().backward()
    moments.observe()
    assert torch.allclose(moments.cross[0], 0.5 * 4 * (h1 / 2) * (h2 / 2))
    assert torch.equal(moments.cross[1], torch.zeros(2)) and torch.equal(moments.cross[2], torch.zeros(2))
    assert torch.allclose(moments.sq[1], 0.5 * (hq / 2) ** 2)  # A still takes q's gradient
    assert moments.count == [1, 1, 1]


def test_a_step_gradscaler_skips_leaves_no_stale_backward_passes():
    """GradScaler skips step() on an overflow, and the loop's zero_grad() clears the gradients:
    the next step's two backward passes are counted from there, and that step folds exactly one
    4 a b (the skipped step none)."""
    import torch.distributed as dist

    import caramel
    had = dist.is_initialized()
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.5))
    model, opt = caramel.parallelize(m, opt, "gossip:topology=ring,second_moment=debiased,cross_term=halves")
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        moments = opt.gossip.moments
        for step in range(3):
            before = [c.clone() for c in moments.cross]
            halves = []
            for part in (slice(0, 4), slice(4, 8)):
                loss = torch.nn.functional.cross_entropy(model(x[part]), y[part]) / 2
                if step == 1:
                    loss = loss * float("inf")  # an overflow: GradScaler skips this step
                scaler.scale(loss).backward()
                halves.append(m.weight.grad.clone() - sum(halves, torch.zeros_like(m.weight)))
            scale = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            assert moments.passes == [0, 0] and moments.count == [(1, 1, 2)[step]] * 2
        a, b = (h / scale for h in halves)  # the last step's halves, unscaled
        assert torch.allclose(moments.cross[0], 0.5 * before[0] + 0.5 * 4 * a * b, rtol=1e-5, atol=1e-9)
    finally:
        caramel.shutdown()
        if dist.is_initialized() and not had:
            dist.destroy_process_group()


def test_bad_cross_term_options_are_refused():
    spec = lambda text: STRATEGIES.spec(text).options  # noqa: E731
    assert spec("gossip:second_moment=debiased,cross_term=halves").halves
    assert not spec("gossip:second_moment=debiased").halves
    with pytest.raises(CaramelError, match="cross_term must be one of first_moment, halves, got 'thirds'"):
        spec("gossip:second_moment=debiased,cross_term=thirds")
    with pytest.raises(CaramelError, match="cross_term=halves .* needs second_moment=debiased"):
        spec("gossip:cross_term=halves")
    with pytest.raises(CaramelError, match="cross_term must be one of"):
        SecondMoment([], torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]), world=2, cross_term="h")


def test_caramel_trains_halves_add_up_to_the_whole_batchs_gradient_and_odd_batches_are_refused():
    """`caramel train`'s split: two half-batch backward passes, each mean loss halved, leave the
    whole batch's mean-loss gradient in p.grad and return its loss; an odd batch is an error."""
    from caramel.train.strategy import Parallel
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    engine = Parallel.__new__(Parallel)
    engine.model = model
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    loss = engine._halves_backward(x, y, torch.nn.functional.cross_entropy)
    split = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    whole = torch.nn.functional.cross_entropy(model(x), y)
    whole.backward()
    assert torch.allclose(loss, whole.detach())
    assert all(torch.allclose(a, p.grad, atol=1e-7) for a, p in zip(split, model.parameters()))
    with pytest.raises(CaramelError, match="this batch has 5 samples"):
        engine._halves_backward(x[:5], y[:5], torch.nn.functional.cross_entropy)
