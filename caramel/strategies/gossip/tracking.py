"""Gradient tracking for the gossip strategy (`algorithm=tracking`): each worker's optimizer
steps with an estimate of the workers' average gradient instead of its own.

Every worker i keeps a tracker y_i of the gossiped parameters' shape and its previous gradient
g_i(t-1). At each `optimizer.step()` (ATC-DIGing's form, Nedic, Olshevsky and Shi, 2017):

    z_i = y_i(t-1) + g_i(t) - g_i(t-1)          (y_i(-1) = g_i(-1) = 0)
    y_i(t) = sum_j W[i, j] z_j                  (one exchange, like the parameters')
    the optimizer steps with y_i(t) in p.grad, then p.grad is the worker's own gradient again

With a doubly-stochastic W the trackers' sum is the gradients' sum at every step (the tracking
invariant: sum_i y_i(t) = sum_i g_i(t)), so each worker's Adam normalizes by the second moment of
an estimate of the average gradient, not of its own quarter-batch one; with the complete graph
every y_i is the average and each worker takes DDP's step (unless a gradient is clipped: clipping
acts on g_i, the optimizer steps with the unclipped y_i). The mix comes after the correction,
so the trackers' disagreement shrinks by W at every step and a worker's stochastic-gradient
noise is mixed before its optimizer sees it. The price: the tracker exchange needs this step's
gradients and must land before the update (no overlap with the next forward).
"""
from __future__ import annotations

from typing import Any

import torch

from caramel.errors import CaramelError
from caramel.strategies.gossip.engine import Exchange, make_buckets
from caramel.strategies.gossip.topology import Neighbours


class Tracker:
    """The trackers y_i and previous gradients g_i(t-1) of `shared` ((name, parameter)), mixed
    over `exchange` (its own: the trackers' buckets are mixed at step(), never in a forward).

    Both are kept in at least float32 (a bf16/fp16 parameter's tracker is float32, and travels
    so): the invariant sum_i y_i = sum_i g_i holds only as far as each step's y + g - g_prev and
    mix are exact, and a low-precision tracker's rounding would pile up in it, never corrected.
    g_prev holds a low-precision gradient exactly, so the user's gradient comes back unchanged."""

    def __init__(self, shared: list[tuple[str, torch.Tensor]], exchange: Exchange):
        self.names = [n for n, _ in shared]
        self.params = [p for _, p in shared]
        self.y = [torch.zeros_like(p, dtype=tracker_dtype(p.dtype), memory_format=torch.contiguous_format)
                  for p in self.params]
        self.g_prev = [torch.zeros_like(y) for y in self.y]
        self.exchange = exchange

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.y)

    def swap_in(self, nb: Neighbours, cap_bytes: float) -> None:
        """Correct, mix and hand the trackers to the optimizer as gradients. A parameter without
        a gradient this step counts as a zero gradient in its tracker and keeps no gradient, so
        the optimizer skips it as it would under dpsgd."""
        for name, p in zip(self.names, self.params):
            if p.grad is not None and p.grad.layout != torch.strided:
                raise CaramelError(sparse_refusal(name))
        with torch.no_grad():
            for p, y, g_prev in zip(self.params, self.y, self.g_prev):
                if p.grad is None:
                    y.sub_(g_prev)
                    g_prev.zero_()
                else:
                    y.add_(p.grad).sub_(g_prev)
                    g_prev.copy_(p.grad)
        self.exchange.set_buckets(make_buckets(list(zip(self.names, self.y)), {}, [], cap_bytes))
        self.exchange.start(nb)
        self.exchange.flush()
        with torch.no_grad():
            for p, y in zip(self.params, self.y):
                if p.grad is not None:
                    p.grad.copy_(y)

    def swap_out(self) -> None:
        """After the update: each parameter's gradient is the worker's own again."""
        with torch.no_grad():
            for p, g_prev in zip(self.params, self.g_prev):
                if p.grad is not None:
                    p.grad.copy_(g_prev)

    def state_dict(self) -> dict[str, Any]:
        return {"y": {n: y.detach().clone() for n, y in zip(self.names, self.y)},
                "g_prev": {n: g.detach().clone() for n, g in zip(self.names, self.g_prev)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for n, y, g in zip(self.names, self.y, self.g_prev):
                y.copy_(state["y"][n])
                g.copy_(state["g_prev"][n])


def tracker_dtype(dtype: torch.dtype) -> torch.dtype:
    """A parameter's tracker dtype: its own when at least float32 wide, else float32."""
    return torch.promote_types(dtype, torch.float32)


def sparse_refusal(name: str) -> str:
    return (f"strategy 'gossip': algorithm=tracking keeps a dense tracker of every gradient, and parameter "
            f"{name!r} gets sparse gradients (nn.Embedding(sparse=True)); make it dense (sparse=False) or "
            "use another gossip algorithm")


def check_dense_grads(module: torch.nn.Module, shared: list[tuple[str, torch.Tensor]]) -> None:
    """Refuse, before any step, a gossiped parameter of a module that makes sparse gradients."""
    ids = {id(p): n for n, p in shared}
    for m in module.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse and id(m.weight) in ids:
            raise CaramelError(sparse_refusal(ids[id(m.weight)]))
