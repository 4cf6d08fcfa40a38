"""Flat gradient buckets: what a sealed bucket holds, against the gradients put into it."""
import pytest
import torch
import torch.nn as nn

from caramel.plan.plan import Bucket
from caramel.runtime.buckets import FlatBucket


def _bucket(shapes, world_size: int, num_chunks: int = 1) -> tuple[FlatBucket, list[nn.Parameter]]:
    params = [nn.Parameter(torch.zeros(s)) for s in shapes]
    numel = sum(p.numel() for p in params)
    spec = Bucket(id=0, params=list(range(len(params))), dtype="float32", numel=numel, bytes=4 * numel,
                  num_chunks=num_chunks)
    return FlatBucket(spec, params, world_size), params


@pytest.mark.timeout(10)
def test_seal_copies_every_gradient_pre_divided_and_writes_the_usage_flags():
    fb, params = _bucket([(3, 2), (4,), (2, 1, 2)], world_size=4)
    grads = [torch.arange(6.0).reshape(3, 2), torch.full((4,), 8.0), torch.ones(2, 1, 2)]
    for j in (2, 0, 1):  # in any order, as backward delivers them
        fb.put(j, grads[j])
    assert fb.pending == 0
    fb.seal()
    for j, g in enumerate(grads):
        assert torch.equal(fb.grad_view(j), g / 4)
        assert fb.grad_view(j).shape == params[j].shape
    assert fb.flags.tolist() == [1.0, 1.0, 1.0]
    # the buffer holds copies: changing a gradient afterwards changes nothing sent
    grads[1].fill_(-1.0)
    assert torch.equal(fb.grad_view(1), torch.full((4,), 2.0))


@pytest.mark.timeout(10)
def test_a_parameter_without_a_gradient_is_zero_and_flagged_unused():
    fb, _ = _bucket([(2,), (3,)], world_size=2, num_chunks=2)
    fb.flat.fill_(7.0)  # what a previous step left
    fb.put(0, None)
    fb.put(1, torch.tensor([2.0, 4.0, 6.0]))
    fb.seal()
    assert fb.grad_view(0).tolist() == [0.0, 0.0]
    assert fb.grad_view(1).tolist() == [1.0, 2.0, 3.0]
    assert fb.flags.tolist() == [0.0, 1.0]
    # the flags travel in the last chunk
    assert fb.chunks[-1].data_ptr() <= fb.flags.data_ptr()
    assert fb.chunks[-1].numel() + fb.chunks[0].numel() == fb.flat.numel()


@pytest.mark.timeout(10)
def test_gradients_in_another_layout_are_copied_by_value():
    fb, _ = _bucket([(2, 3)], world_size=1)
    g = torch.arange(6.0).reshape(3, 2).t()  # not contiguous
    fb.put(0, g)
    fb.seal()
    assert torch.equal(fb.grad_view(0), g)
    fb.new_iteration()
    assert fb.pending == 1 and fb.fired == [False]
