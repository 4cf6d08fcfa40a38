"""The gossip exchange: after each optimizer step every worker sends its parameters to its
out-neighbours with batched point-to-point transfers, and mixes what its in-neighbours sent.

    step t:   optimizer.step()  ->  start(t): buckets in forward order, one batch of isend/irecv each
    step t+1: forward pre-hook of module m  ->  mix the buckets holding m's tensors (waits only for them)
              optimizer.step()  ->  flush(): mix whatever no forward needed (unused modules), then ...

A bucket's mix is x <- sum_j W[i, j] x_j over the sender's snapshot and the received copies,
summed in rank order so that workers meant to agree (the complete graph) agree bit for bit.
`mix_in_forward=False` leaves every mix to `flush()` at the next step (Wang et al.'s overlapped
form: the gradient is computed at the un-mixed parameters while they travel). A tensor in
`increments` (floating buffers then) gets the mix as an increment, x <- x + (mixed - sent): the
step's forward has changed it since it was sent, and that change is kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from caramel.strategies.gossip.topology import Neighbours


@dataclass
class Bucket:
    """Tensors mixed together: one message per peer. `tensors` are live (parameters, buffers,
    momentum buffers); `modules` the modules whose forward needs them mixed first."""

    tensors: list[torch.Tensor]
    modules: set[str] = field(default_factory=set)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class InFlight:
    works: list[Any]
    sent: torch.Tensor
    received: dict[int, torch.Tensor]
    neighbours: Neighbours


class Exchange:
    """Start, wait for and apply one step's gossip at a time over `groups` (global `ranks`).

    `groups` is (up, down): a message from a lower to a higher index travels on `up`, the
    other way on `down`, so each connection carries one direction. Gloo moves a pair's two
    directions over one socket; measured on the emulated cluster (2 workers, 348 Mbit/s,
    2.8 MB each way at once), one group took 131-136 ms in about half the exchanges (one
    direction after the other) where one group per direction took 67 ms, the link's rate
    (docs/gossip.md, "One connection per direction")."""

    def __init__(self, groups: tuple[Any, Any], ranks: list[int], rank: int, mix_in_forward: bool, tag_base: int = 0):
        self.groups, self.ranks, self.rank = groups, ranks, rank
        self.mix_in_forward = mix_in_forward
        # ids of the tensors mixed as an increment (x + mixed - sent) rather than set to the mix
        self.increments: set[int] = set()
        # bucket b travels with tag tag_base + b: the trackers' exchange may be in flight beside
        # the parameters' (started in backward while unused modules' buckets still wait)
        self.tag_base = tag_base
        self.buckets: list[Bucket] = []
        self.by_module: dict[str, list[int]] = {}
        self.pending: dict[int, InFlight] = {}
        self.wait_s = 0.0  # time blocked on arrivals, in total
        self.bytes_sent = 0  # in total, every peer counted

    def set_buckets(self, buckets: list[Bucket]) -> None:
        self.buckets = buckets
        self.by_module = {}
        for b, bucket in enumerate(buckets):
            for m in bucket.modules:
                self.by_module.setdefault(m, []).append(b)

    def start(self, nb: Neighbours) -> None:
        """Snapshot every bucket and hand its sends and receives to the backend (non-blocking)."""
        assert not self.pending, "a gossip step started before the previous one was mixed"
        for b in range(len(self.buckets)):
            self.start_bucket(b, nb)

    def start_bucket(self, b: int, nb: Neighbours, sent: torch.Tensor | None = None) -> None:
        """Send bucket b (`sent`: the flat values to send, else a snapshot of its tensors) to
        nb's out-neighbours and receive theirs (non-blocking)."""
        assert b not in self.pending, f"gossip bucket {b} started twice"
        if sent is None:
            sent = torch.cat([t.detach().reshape(-1) for t in self.buckets[b].tensors])
        received = {j: torch.empty_like(sent) for j, _ in nb.recv}
        by_group: dict[int, list[Any]] = {0: [], 1: []}  # batch_isend_irecv takes one group's ops
        tag = self.tag_base + b
        for j in nb.send:
            g = 0 if self.rank < j else 1
            by_group[g].append(dist.P2POp(dist.isend, sent, self.ranks[j], self.groups[g], tag=tag))
        for j, _ in nb.recv:
            g = 0 if j < self.rank else 1
            by_group[g].append(dist.P2POp(dist.irecv, received[j], self.ranks[j], self.groups[g], tag=tag))
        works = [w for ops in by_group.values() if ops for w in dist.batch_isend_irecv(ops)]
        self.bytes_sent += sent.numel() * sent.element_size() * len(nb.send)
        self.pending[b] = InFlight(works, sent, received, nb)

    def drop(self, b: int) -> None:
        """Wait for bucket b's transfers and discard them (its values changed: sent again)."""
        self._wait(self.pending.pop(b))

    def before_module(self, name: str) -> None:
        """Forward pre-hook: mix the pending buckets this module's tensors are in."""
        if self.mix_in_forward and self.pending:
            for b in self.by_module.get(name, ()):
                if b in self.pending:
                    self._mix(b)

    def flush(self) -> None:
        """Mix every pending bucket (at step(), and at every sync point)."""
        for b in sorted(self.pending):
            self._mix(b)

    def settle(self) -> None:
        """Wait until every pending transfer has landed, without mixing (the sync point of
        algorithm=overlap, adam and overlap_momentum: the mix belongs to the next update)."""
        for b in sorted(self.pending):
            self._wait(self.pending[b])

    def pending_values(self) -> dict[int, torch.Tensor]:
        """id(tensor) -> the value its pending mix will give it, or for a tensor in `increments`
        the increment it will add (for checkpoints), nothing applied."""
        out = {}
        for b in sorted(self.pending):
            f = self.pending[b]
            mixed = self._combine(f)
            for t, value in zip(self.buckets[b].tensors, self._slices(mixed, f.sent, self.buckets[b].tensors)):
                out[id(t)] = value.clone()
        return out

    def _slices(self, mixed: torch.Tensor, sent: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per tensor, its part of `mixed`, or for one in `increments` its part of mixed - sent."""
        out, offset = [], 0
        for t in tensors:
            part = mixed[offset:offset + t.numel()].view_as(t)
            if id(t) in self.increments:
                part = part - sent[offset:offset + t.numel()].view_as(t)
            out.append(part)
            offset += t.numel()
        return out

    def _wait(self, f: InFlight) -> None:
        t0 = time.perf_counter()
        for w in f.works:
            w.wait()
        f.works = []
        self.wait_s += time.perf_counter() - t0

    def _combine(self, f: InFlight) -> torch.Tensor:
        self._wait(f)
        parts = sorted([(self.rank, f.neighbours.self_weight, f.sent)] + [(j, w, f.received[j]) for j, w in f.neighbours.recv],
                       key=lambda x: x[0])
        mixed = parts[0][2].mul(parts[0][1])
        for _, w, x in parts[1:]:
            mixed.add_(x, alpha=w)
        return mixed

    def _mix(self, b: int) -> None:
        f = self.pending.pop(b)
        tensors = self.buckets[b].tensors
        with torch.no_grad():
            for t, value in zip(tensors, self._slices(self._combine(f), f.sent, tensors)):
                if id(t) in self.increments:
                    t.add_(value)
                else:
                    t.copy_(value)


def make_buckets(tensors: list[tuple[str, torch.Tensor]], owner: dict[int, str],
                 order: list[str], cap_bytes: float) -> list[Bucket]:
    """Group `tensors` ((name, tensor)) into buckets in the order their owning modules (`owner`:
    id -> module) first ran (`order`; modules that never ran last), cut at `cap_bytes` and dtype changes."""
    rank_of = {m: k for k, m in enumerate(order)}
    ordered = sorted(tensors, key=lambda nt: rank_of.get(owner.get(id(nt[1]), ""), len(order)))
    buckets: list[Bucket] = []
    size, dtype = 0, None
    for _, t in ordered:
        if not buckets or size + t.numel() * t.element_size() > cap_bytes and buckets[-1].tensors or t.dtype != dtype:
            buckets.append(Bucket([]))
            size, dtype = 0, t.dtype
        buckets[-1].tensors.append(t)
        size += t.numel() * t.element_size()
        m = owner.get(id(t))
        if m is not None:
            buckets[-1].modules.add(m)
    return buckets
