"""The pull side of `PsEngine`: how pulled buckets land, relay through a node leader, and are
copied into the parameters before a forward uses them (`catch_up`), plus the bookkeeping of the
sends a server has handed to its backend.

A mixin kept apart from `engine.py` (push, apply, synchronize) so each file holds one side of a
step; it reads the engine's attributes (`params`, `plan`, `pulls`, `relays`, `sends`, `version`,
`stale`, ...) and is used only as `PsEngine`'s base.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from caramel.strategies.ps.buckets import recv_buf, send_buf, unflatten
from caramel.strategies.ps.options import ASP_BOUND_STEPS
from caramel.strategies.ps.sender import send_pull
from caramel.strategies.ps.transfers import Pull


class PsPulls:
    """Pull-side methods of `PsEngine` (see the module docstring)."""

    def _send_buf(self, members: list[int]) -> torch.Tensor:
        return send_buf([self.params[i] for i in members])

    def _recv_buf(self, members: list[int]) -> torch.Tensor:
        return recv_buf([self.params[i] for i in members])

    def _expect(self, members: list[int], version: int, work: Any, buf: torch.Tensor) -> None:
        """Each parameter of a bucket being pulled lands with the bucket (a view of its buffer)."""
        for i, view in zip(members, unflatten(buf, [self.params[i] for i in members])):
            self.pulls[i].append(Pull(version, work, view))

    def _pull_hierarchical(self, b: int, version: int) -> None:
        """A leader pulls from the server among the leaders (or is the server) and queues the
        relay to its node; any other rank pulls from its leader."""
        members, h = self.plan.pull_buckets[b], self.hier
        i = members[0]
        shard = self.plan.owner[i]
        if not h.is_leader:
            buf = self._recv_buf(members)
            work = dist.broadcast(buf, src=self.ranks[h.leader], group=h.node_pull, async_op=True)
            self._expect(members, version, work, buf)
            return
        if self.server_of(i) == self.rank:
            buf = self._send_buf(members)
            self.sends.append((send_pull(self.sender, buf, self.ranks[self.rank], h.lead_pull[shard], b,
                                         f"pull of bucket {b} (shard {shard})"), buf))
            self.relays.append((None, buf, b))
            return
        buf = self._recv_buf(members)
        work = dist.broadcast(buf, src=self.ranks[self.server_of(i)], group=h.lead_pull[shard], async_op=True)
        self._expect(members, version, work, buf)
        self.relays.append((work, buf, b))

    def relay_pulls(self, force: bool = False) -> None:
        """Hierarchical, at a leader: broadcast to the node, in pull order, each pull that has
        landed (with `force`, all of them, waiting); the relay sender sends them one at a time."""
        while self.relays:
            work, buf, b = self.relays[0]
            if work is not None and not work.is_completed():
                if not force:
                    return
                work.wait()
            self.relays.popleft()
            self.sends.append((send_pull(self.relay_sender, buf, self.ranks[self.rank], self.hier.node_pull, b,
                                         f"relay of pull bucket {b} to the node"), buf))

    def _reap_sends(self) -> None:
        """Forget the sends that are through; one that failed raises here, naming the pull."""
        flags = [w.is_completed() for w, _ in self.sends]
        done, self.sends = [w for (w, _), f in zip(self.sends, flags) if f], [s for s, f in zip(self.sends, flags) if not f]
        for w in done:
            w.wait()

    def _wait_sends(self) -> None:
        for w, _ in self.sends:
            w.wait()
        self.sends = []

    def required_version(self) -> int:
        """The oldest version a forward may use now."""
        limit = ASP_BOUND_STEPS if self.bound is None else self.bound
        return self.steps - limit

    def catch_up(self, idx: list[int], required: int | None = None, forward: bool = False) -> float:
        """Copy in the landed pulls of `idx`, waiting for those older than allowed (`forward`:
        a forward is about to use them); returns the wait (s)."""
        required = self.required_version() if required is None else required
        if self.relays:
            self.relay_pulls()  # what has landed goes on to the node, whatever this rank waits for
        waited = 0.0
        for i in idx:
            q = self.pulls.get(i)
            while q and (self.version[i] < required or q[0].work.is_completed()):
                pull = q.popleft()
                t0 = time.perf_counter()
                pull.work.wait()
                waited += time.perf_counter() - t0
                if self.relays:
                    self.relay_pulls()  # a leader never sits on what its node waits for
                if self.stale is not None:
                    self.stale.landing(i, pull.buf)
                with torch.no_grad():
                    self.params[i].copy_(pull.buf)
                self.version[i] = pull.version
        if forward and self.stale is not None:
            self.stale.extrapolate(idx)
        self.wait_s += waited
        return waited
