"""Asynchronous PipeDream: 1F1B with weight stashing and optional vertical sync.

Each microbatch is a minibatch of its own: after its backward, a stage applies the update at
once (no flush between microbatches), so a stage holds several weight versions at a time. For
the gradient to be right, a microbatch's backward must use the weights its forward used
(*weight stashing*): the forward runs `torch.func.functional_call` on a version's tensors, and
autograd differentiates with respect to exactly those tensors. With *vertical sync* every stage
uses the version the first stage used for that microbatch (its number travels with the
activation), so a microbatch sees one consistent model, staler than without.

Stage s of S runs `warmup = min(M, S - s - 1)` forwards, then alternates forward and backward,
then drains; versions advance across `step()` calls, the pipeline drains at the end of each.
Sends are asynchronous (gloo `isend`) so the two directions never wait on each other.
Each message is a header (version, dtype, shape) then the tensor.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.func import functional_call

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
_HEADER = 10  # version, dtype code, ndim, up to 7 dims


class PipeDreamStage:
    """One stage's side of asynchronous PipeDream. `log` records, per microbatch, the weight
    version its forward used and the one its backward differentiated (the tests compare them)."""

    def __init__(self, module: nn.Module, stage: int, stages: int, optimizer: torch.optim.Optimizer,
                 pipeline_ranks: tuple[int, ...], group: Any, microbatches: int, vertical_sync: bool = False) -> None:
        self.module, self.stage, self.stages = module, stage, stages
        self.optimizer, self.group, self.microbatches = optimizer, group, microbatches
        self.vertical_sync = vertical_sync
        self.prev = pipeline_ranks[stage - 1] if stage > 0 else None
        self.next = pipeline_ranks[stage + 1] if stage < stages - 1 else None
        self.names = [n for n, _ in module.named_parameters()]
        self.params = [p for _, p in module.named_parameters()]
        self.log: list[dict[str, int]] = []
        self.reset_versions()

    def reset_versions(self) -> None:
        """Forget every stashed version (after loading weights): the live weights are version 0."""
        self.version = 0
        self.versions: dict[int, list[torch.Tensor]] = {0: [p.detach().clone() for p in self.params]}
        self.pinned: dict[int, int] = {}  # version -> microbatches in flight that stashed it

    # --- one step: M microbatches, 1F1B, drained at the end -----------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> torch.Tensor | None:
        m = self.microbatches
        xs, ys = inputs.chunk(m), targets.chunk(m)
        warmup = min(m, self.stages - self.stage - 1)
        inflight: dict[int, tuple] = {}
        losses: list[torch.Tensor] = []
        sends: list[Any] = []
        for i in range(warmup):
            inflight[i] = self._forward(i, xs[i], sends)
        for k in range(m - warmup):
            i = warmup + k
            inflight[i] = self._forward(i, xs[i], sends)
            self._backward(k, inflight.pop(k), ys[k], loss_fn, losses, sends)
        for k in range(m - warmup, m):
            self._backward(k, inflight.pop(k), ys[k], loss_fn, losses, sends)
        for w in sends:
            w.wait()
        self._prune()
        return torch.stack(losses).mean() if losses else None

    def _forward(self, i: int, x: torch.Tensor, sends: list) -> tuple:
        if self.prev is None:
            version, x_in = self.version, x
        else:
            version, x_in = self._recv(self.prev)
            x_in.requires_grad_(True)
        if not self.vertical_sync:
            version = self.version
        self.pinned[version] = self.pinned.get(version, 0) + 1
        weights = [t.detach().requires_grad_(p.requires_grad) for t, p in zip(self.versions[version], self.params)]
        out = functional_call(self.module, dict(zip(self.names, weights)), (x_in,))
        if self.next is not None:
            # the version the first stage used travels on (vertical sync reads it)
            sends += self._send(out.detach(), self.next, version if self.stage == 0 or self.vertical_sync else -1)
        self.log.append({"microbatch": i, "phase": 0, "version": version})
        return version, x_in, weights, out

    def _backward(self, i: int, saved: tuple, y: torch.Tensor, loss_fn: Callable, losses: list, sends: list) -> None:
        version, x_in, weights, out = saved
        if self.next is None:
            loss = loss_fn(out, y.to(out.device))
            losses.append(loss.detach())
            root, grad_out = loss, None
        else:
            _, grad_out = self._recv(self.next)
            root = out
        wrt = [w for w in weights if w.requires_grad] + ([x_in] if self.prev is not None else [])
        grads = torch.autograd.grad(root, wrt, grad_outputs=grad_out)
        if self.prev is not None:
            sends += self._send(grads[-1], self.prev, version)
            grads = grads[:-1]
        # which stashed version the differentiated tensors belong to (they share its storage)
        used = next(v for v, ts in self.versions.items()
                    if all(w.data_ptr() == t.data_ptr() for w, t in zip(weights, ts)))
        self.log.append({"microbatch": i, "phase": 1, "version": used})
        grad_of = iter(grads)
        for p in self.params:
            p.grad = next(grad_of) if p.requires_grad else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.versions[self.version] = [p.detach().clone() for p in self.params]
        self.pinned[version] -= 1
        if not self.pinned[version]:
            del self.pinned[version]
        self._prune()

    def _prune(self) -> None:
        """Drop versions no microbatch can still need: those stashed by microbatches in flight
        stay, and with vertical sync the last `stages` (a later microbatch may ask for one)."""
        horizon = self.stages if self.vertical_sync else 0
        for v in [v for v in self.versions if v < self.version - horizon and v not in self.pinned]:
            del self.versions[v]

    # --- point to point, with a small header ---------------------------------------------------

    def _send(self, t: torch.Tensor, dst: int, version: int) -> list:
        t = t.contiguous()
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0], header[1], header[2] = version, _DTYPES.index(t.dtype), t.dim()
        header[3: 3 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        return [dist.isend(header, dst, group=self.group), dist.isend(t, dst, group=self.group)]

    def _recv(self, src: int) -> tuple[int, torch.Tensor]:
        header = torch.zeros(_HEADER, dtype=torch.int64)
        dist.recv(header, src, group=self.group)
        version, dtype, ndim = int(header[0]), _DTYPES[int(header[1])], int(header[2])
        t = torch.empty([int(d) for d in header[3: 3 + ndim]], dtype=dtype)
        dist.recv(t, src, group=self.group)
        return version, t
