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
noise is mixed before its optimizer sees it.

The exchange needs this step's gradients and must land before the update (sent with the
parameters after the update, y would be mixed before g(t) is added: DSGT's form, another
algorithm, docs/gossip.md). `overlap=True` starts it where the data allows: a tracker message leaves from the gradient hooks as soon as
its parameters' gradients are final in backward (messages cut in reverse forward order, the
order backward meets the modules, agreed by every rank at the first step()); the end of the
backward sends the messages no hook did, so every armed backward sends each message once.
step() waits for each only before the update, so it hides behind the rest of backward. The
values sent are the reference's: z is formed from the same gradient with the same
operations, and step() checks that each gradient is the tensor backward left, unedited (its
version counter: clipping or unscaling in between is refused, the neighbours already mixed
the old values; an edit through `.data` escapes the counter). `overlap=False` forms and
sends every tracker at step() (the reference path).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from caramel.errors import CaramelError
from caramel.strategies.gossip.engine import Bucket, Exchange, make_buckets
from caramel.strategies.gossip.topology import Neighbours
from caramel.strategies.gossip.volume import tracker_dtype


class Tracker:
    """The trackers y_i and previous gradients g_i(t-1) of `shared` ((name, parameter)), mixed
    over `exchange` (its own: the trackers' buckets are mixed at step(), never in a forward).

    Both are kept in at least float32 (a bf16/fp16 parameter's tracker is float32, and travels
    so): the invariant sum_i y_i = sum_i g_i holds only as far as each step's y + g - g_prev and
    mix are exact, and a low-precision tracker's rounding would pile up in it, never corrected.
    g_prev holds a low-precision gradient exactly, so the user's gradient comes back unchanged.

    With `overlap`, `layout()` gives this step's neighbours and tracker buckets (built at the
    step's first ready gradient) and `grad_ready(k)` is parameter k's post-accumulate hook;
    `armed` is False while the last forward ran inside `no_sync()` (no message leaves)."""

    def __init__(self, shared: list[tuple[str, torch.Tensor]], exchange: Exchange, overlap: bool = False,
                 layout: Callable[[], tuple[Neighbours, list[Bucket]]] | None = None):
        self.names = [n for n, _ in shared]
        self.params = [p for _, p in shared]
        self.y = [torch.zeros_like(p, dtype=tracker_dtype(p.dtype), memory_format=torch.contiguous_format)
                  for p in self.params]
        self.g_prev = [torch.zeros_like(y) for y in self.y]
        self.exchange = exchange
        self.overlap, self.layout = overlap, layout
        self.armed = True
        self.nb: Neighbours | None = None
        self.members: list[list[int]] | None = None  # per bucket, its parameters' positions (None: not laid out)
        self.slot: dict[int, int] = {}  # parameter position -> bucket
        self.fired: list[set[int]] = []  # per bucket, the parameters whose gradient is final this backward
        self.agreed = False  # whether every rank's message layout is the same (from the first step() on)
        self.in_backward = False  # an armed backward is running (its end-of-backward callback queued)
        self.seen: list[tuple[int, int] | None] | None = None  # each gradient as the last armed backward left it
        self.sent_in_backward = 0  # tracker messages that left from the gradient hooks, in total

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
        if self.overlap:
            self._swap_in_overlapped()
        else:
            self._swap_in_at_step(nb, cap_bytes)
        with torch.no_grad():
            for p, y in zip(self.params, self.y):
                if p.grad is not None:
                    p.grad.copy_(y)

    def _swap_in_at_step(self, nb: Neighbours, cap_bytes: float) -> None:
        """The reference path: every tracker formed, sent and mixed here."""
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

    def _swap_in_overlapped(self) -> None:
        """The messages backward started must hold what the reference would send now: every
        gradient is the tensor the last backward left, unedited (same object, same version
        counter), checked before any message leaves here; the rest leave now. Then every
        message is mixed into the trackers (waiting for each in turn)."""
        ex = self.exchange
        changed = [] if self.seen is None else [k for k, v in enumerate(self.seen) if v != self._version(k)]
        if changed:
            ex.settle()  # the neighbours' messages land, none is mixed: the trackers stay as they were
            ex.pending.clear()
            self.members, self.seen = None, None
            raise CaramelError(changed_refusal([self.names[k] for k in changed]))
        if self.members is None:
            self._lay_out()
        with torch.no_grad():
            for b in range(len(self.members)):
                if b not in ex.pending:
                    ex.start_bucket(b, self.nb, self._z(b))
            for p, g_prev in zip(self.params, self.g_prev):
                if p.grad is None:
                    g_prev.zero_()
                else:
                    g_prev.copy_(p.grad)
        ex.flush()  # each bucket's mix is copied into its trackers y
        self.members, self.seen = None, None

    def grad_ready(self, k: int) -> None:
        """Parameter k's gradient is final for this backward: once every gradient of its bucket
        is, send the bucket's z. The backward's first final gradient queues `_end_backward`,
        which sends every message no hook sent (parameters this backward did not reach), so
        every armed backward sends every message exactly once on every rank. A later armed
        backward before step() (gradients accumulating outside no_sync()) withdraws them all
        first, and sends them all again; as with DDP, every worker must run the same backwards."""
        if not (self.overlap and self.armed):
            return
        ex = self.exchange
        if not self.in_backward:
            self.in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            for b in sorted(ex.pending):
                ex.drop(b)
            self.fired = [set() for _ in self.fired]
        if not self.agreed:  # the first step: no message layout every rank agrees on yet
            return
        if self.members is None:
            self._lay_out()
        b = self.slot[k]
        self.fired[b].add(k)
        if len(self.fired[b]) == len(self.members[b]) and b not in ex.pending:
            self._send(b)

    def _end_backward(self) -> None:
        """End of an armed backward: send what the hooks did not, and note each gradient as
        the backward left it (what step() checks)."""
        self.in_backward = False
        if self.agreed:
            if self.members is None:
                self._lay_out()
            for b in range(len(self.members)):
                if b not in self.exchange.pending:
                    self._send(b)
        self.seen = [self._version(k) for k in range(len(self.params))]

    def _send(self, b: int) -> None:
        with torch.no_grad():
            self.exchange.start_bucket(b, self.nb, self._z(b))
        self.sent_in_backward += 1

    def _version(self, k: int) -> tuple[int, int] | None:
        """Which tensor parameter k's gradient is, and its version counter (bumped by every
        in-place edit through autograd's view of it: clip_grad_norm_, grad.mul_, unscale_)."""
        g = self.params[k].grad
        return None if g is None else (id(g), g._version)

    def _lay_out(self) -> None:
        self.nb, buckets = self.layout()
        self.exchange.set_buckets(buckets)
        position = {id(y): k for k, y in enumerate(self.y)}
        self.members = [[position[id(t)] for t in bucket.tensors] for bucket in buckets]
        self.slot = {k: b for b, ks in enumerate(self.members) for k in ks}
        self.fired = [set() for _ in buckets]

    def _z(self, b: int) -> torch.Tensor:
        """Bucket b's y + g - g_prev, flat, by the reference path's operations (out of place:
        y changes only when the mix lands)."""
        parts = []
        for k in self.members[b]:
            p, y, g_prev = self.params[k], self.y[k], self.g_prev[k]
            parts.append((y.sub(g_prev) if p.grad is None else y.add(p.grad).sub_(g_prev)).reshape(-1))
        return torch.cat(parts)

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


def changed_refusal(names: list[str]) -> str:
    return (f"strategy 'gossip': algorithm=tracking sends the trackers of {', '.join(names[:3])}"
            f"{' ...' if len(names) > 3 else ''} during backward (overlap_trackers=true), and their gradients changed "
            "between backward and optimizer.step() (gradient clipping, GradScaler.unscale_, an edit of p.grad); the "
            "neighbours already mixed the old values. Set overlap_trackers=false to form the trackers at step() "
            "from the gradients as they are then")


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
