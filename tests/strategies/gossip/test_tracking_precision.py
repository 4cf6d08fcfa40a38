"""Gradient tracking's bookkeeping in one process (a one-worker exchange: the mix is the
identity, so the invariant reads y = g at every step): low-precision parameters keep float32
trackers, and sparse gradients are refused with one clear error."""
from __future__ import annotations

import pytest
import torch

import caramel
from caramel.errors import CaramelError
from caramel.strategies.gossip.engine import Exchange
from caramel.strategies.gossip.topology import Neighbours
from caramel.strategies.gossip.tracking import Tracker

ALONE = Neighbours(1.0, (), ())
STEPS = 60


def _tracker(params: list[torch.nn.Parameter]) -> Tracker:
    return Tracker([(f"p{k}", p) for k, p in enumerate(params)], Exchange((None, None), [0], 0, mix_in_forward=False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_trackers_keep_the_invariant_to_float32_precision(dtype):
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(4096, dtype=dtype))
    tracker = _tracker([p])
    assert tracker.y[0].dtype == tracker.g_prev[0].dtype == torch.float32
    scale = 0.0
    for _ in range(STEPS):
        # gradients whose size changes by up to 100x from step to step: bf16's rounding of
        # y + g - g_prev would be up to 2^-9 of the largest of them, every step
        g = (torch.randn(4096, generator=gen) * 10 ** (4 * torch.rand(1, generator=gen) - 2)).to(dtype)
        scale = max(scale, float(g.float().abs().max()))
        p.grad = g.clone()
        tracker.swap_in(ALONE, 2 ** 20)
        gap = float((tracker.y[0] - g.float()).abs().max())
        # two float32 roundings a step, each at most 2^-24 of a value at most 3x the largest gradient
        assert gap <= STEPS * 2 * 2 ** -24 * 3 * scale, (gap, scale)
        assert torch.equal(p.grad, tracker.y[0].to(dtype))  # the optimizer steps with the tracker
        tracker.swap_out()
        assert torch.equal(p.grad, g)  # the user's gradient comes back bit for bit


def test_a_sparse_gradient_is_refused_with_the_parameters_name():
    p = torch.nn.Parameter(torch.zeros(10, 4))
    tracker = _tracker([p])
    p.grad = torch.sparse_coo_tensor([[1, 3]], torch.ones(2, 4), (10, 4), check_invariants=True)
    with pytest.raises(CaramelError, match=r"algorithm=tracking .*'p0' gets sparse gradients.*sparse=False"):
        tracker.swap_in(ALONE, 2 ** 20)


def test_a_sparse_embedding_is_refused_before_any_step():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CaramelError, match=r"algorithm=tracking .*'0.weight' gets sparse gradients.*sparse=False"):
        caramel.parallelize(model, opt, "gossip:algorithm=tracking")
