"""The gradient arithmetic and autograd functions behind `caramel.profile.split_backward`.

Split backward needs a layer's weight gradient computed apart from its input gradient, with the
same kernels autograd runs (so the same bits): `weight_grads` and `dense_weight_grads` compute
(weight, bias) gradients of a kept call, dense or narrowed, and the autograd functions here run a
layer's forward and, in backward, return the input gradient only while handing (input, output
gradient) to the `SplitBackward` that recorded it. They sit apart from `SplitBackward` because
they are the per-layer arithmetic, while `SplitBackward` is the bookkeeping of what is deferred.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

def weight_grads(module: nn.Module, inp: torch.Tensor, g: torch.Tensor,
                 weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight gradient, bias gradient) of one call of `module` on `inp` with output gradient `g`
    (`weight`: the weight that call used, when not the module's own: a narrow slice of it)."""
    if isinstance(module, nn.Linear):
        g2, x2 = g.reshape(-1, g.shape[-1]), inp.reshape(-1, inp.shape[-1])
        return g2.t().mm(x2), g2.sum(0)
    if isinstance(module, nn.Embedding):
        gw = torch.zeros_like(module.weight)
        gw.index_add_(0, inp.reshape(-1), g.reshape(-1, g.shape[-1]).to(gw.dtype))
        if module.padding_idx is not None:
            gw[module.padding_idx].zero_()
        return gw, None
    # the kernel autograd's convolution backward runs, weight and bias only: its bias gradient is
    # summed in another order than `g.sum(dims)`, and a resumed run must repeat the original's
    # arithmetic bit for bit (a split step can fall anywhere in a run)
    weight = module.weight if weight is None else weight
    bias = module.bias
    _, gw, gb = torch.ops.aten.convolution_backward(
        g, inp, weight, [weight.shape[0]] if bias is not None else None, module.stride,
        module.padding, module.dilation, False, [0] * (inp.dim() - 2), module.groups,
        [False, True, bias is not None])  # splittable(): padding is a tuple of ints here
    return gw, gb


def dense_weight_grads(module: nn.Module, inp: torch.Tensor, g: torch.Tensor, out_k: torch.Tensor | None,
                       cols: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The module's full-size (weight, bias) gradients of a call that computed only the rows
    `out_k` and columns `cols` of its weight (None: all): the narrow gradients scattered into
    zeros, as autograd's `index_select` backward does, columns first (the narrow forward sliced
    rows first)."""
    if out_k is None and cols is None:
        return weight_grads(module, inp, g)
    full = module.weight
    gw, gb = weight_grads(module, inp, g, weight=_narrow_weight(full.detach(), out_k, cols))
    if cols is not None:
        rows = len(out_k) if out_k is not None else full.shape[0]
        gw = gw.new_zeros((rows,) + tuple(full.shape[1:])).index_add_(1, cols, gw)
    if out_k is not None:
        gw = gw.new_zeros(full.shape).index_add_(0, out_k, gw)
        if gb is not None:
            gb = gb.new_zeros(module.bias.shape).index_add_(0, out_k, gb)
    return gw, gb


def _narrow_weight(weight: torch.Tensor, out_k: torch.Tensor | None, cols: torch.Tensor | None) -> torch.Tensor:
    """The slice a narrow forward computes with (the same `index_select`s, so the same values)."""
    if out_k is not None:
        weight = weight.index_select(0, out_k)
    if cols is not None:
        weight = weight.index_select(1, cols)
    return weight


def _input_grad(module: nn.Module, inp: torch.Tensor, weight: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Linear):
        return g.matmul(weight.to(g.dtype))
    conv_input = torch.nn.grad.conv1d_input if isinstance(module, nn.Conv1d) else torch.nn.grad.conv2d_input
    return conv_input(inp.shape, weight, g, module.stride, module.padding, module.dilation, module.groups)


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class _DenseSplit(torch.autograd.Function):
    """Linear or convolution whose backward returns the input gradient only."""

    @staticmethod
    def forward(ctx, inp, _anchor, split, module):
        ctx.split, ctx.module = split, module
        weight, bias = module.weight.detach(), module.bias.detach() if module.bias is not None else None
        ctx.save_for_backward(inp)
        ctx.weight = weight
        ctx.input_needs_grad = inp.requires_grad
        if isinstance(module, nn.Linear):
            return F.linear(inp, weight, bias)
        return module._conv_forward(inp, weight, bias)

    @staticmethod
    def backward(ctx, g):
        (inp,) = ctx.saved_tensors
        if ctx.split.accumulating() and not ctx.split._early(ctx.module, inp, g):
            ctx.split._keep(ctx.module, inp, g)
        gi = _input_grad(ctx.module, inp, ctx.weight, g) if ctx.input_needs_grad else None
        return gi, None, None, None


class _NarrowSplit(torch.autograd.Function):
    """A narrowed Linear or convolution (kept rows `out_k`, columns `cols` of its weight) whose
    backward returns the input gradient only and keeps the rest for the weight gradient."""

    @staticmethod
    def forward(ctx, inp, _anchor, split, module, out_k, cols):
        ctx.split, ctx.module, ctx.out_k, ctx.cols = split, module, out_k, cols
        weight = _narrow_weight(module.weight.detach(), out_k, cols)
        bias = module.bias.detach() if module.bias is not None else None
        if bias is not None and out_k is not None:
            bias = bias.index_select(0, out_k)
        ctx.save_for_backward(inp)
        ctx.weight = weight
        ctx.input_needs_grad = inp.requires_grad
        if isinstance(module, nn.Linear):
            return F.linear(inp, weight, bias)
        return F.conv2d(inp, weight, bias, module.stride, module.padding, module.dilation, module.groups)

    @staticmethod
    def backward(ctx, g):
        (inp,) = ctx.saved_tensors
        if ctx.split.accumulating() and not ctx.split._early(ctx.module, inp, g, ctx.out_k, ctx.cols):
            ctx.split._keep(ctx.module, inp, g, ctx.out_k, ctx.cols)
        gi = _input_grad(ctx.module, inp, ctx.weight, g) if ctx.input_needs_grad else None
        return gi, None, None, None, None, None


class _EmbeddingSplit(torch.autograd.Function):
    """Embedding lookup whose weight gradient is kept for later (it has no input gradient)."""

    @staticmethod
    def forward(ctx, ids, _anchor, split, module):
        ctx.split, ctx.module = split, module
        ctx.save_for_backward(ids)
        return F.embedding(ids, module.weight.detach(), module.padding_idx)

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        if ctx.split.accumulating():
            ctx.split._keep(ctx.module, ids, g)
        return None, None, None, None
