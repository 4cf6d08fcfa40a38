"""The dispatcher: a plan's (bucket, chunk) items issued in its one global order.

An item is issued as soon as its bucket is ready and every item before it has been issued, so
every rank issues the same collectives in the same order; on a group that runs its collectives
one at a time in issue order (a one-thread gloo group, or one NCCL communicator's stream) that
is also the order bytes go on the wire. While measuring, each collective's issue and completion
times are kept: for the trace, and for the bandwidth the controller plans with.
"""
from __future__ import annotations

import collections
import time
from typing import Any

import torch

from caramel.errors import CaramelError
from caramel.runtime.buckets import FlatBucket
from caramel.runtime.compression import Compressor
from caramel.runtime.stats import bandwidth_from_log
from caramel.trace.recorder import Recorder

RELEASED = "caramel.shutdown() released this model's communication group; parallelize the model again to keep training"


class LocalGroup:
    """World size 1, or muted communication: every 'collective' is already done."""

    class _Done:
        def wait(self) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

        def get_future(self):
            fut = torch.futures.Future()
            fut.set_result(None)
            return fut

    def allreduce(self, tensors):
        return self._Done()

    def allgather(self, outputs, inputs):
        # this rank's input in the first slot, empty slots after it (a zero row count)
        out = outputs[0]
        out[0].copy_(inputs[0])
        for t in out[1:]:
            t.zero_()
        return self._Done()


class Dispatcher:
    """Issues the plan's items on `comm` in order; times them while measuring."""

    def __init__(self, comm: Any, recorder: Recorder, compressor: Compressor | None = None):
        self.comm = comm  # None once released
        self.compressor = compressor
        self.codecs: list[str] | None = None  # per bucket (the plan's); None: none compressed
        self.recorder = recorder
        self.order: list[tuple[int, int]] = []
        self.next_item = 0
        self._requests = 0  # start_measuring() calls not yet stopped
        self.measuring = recorder.enabled
        self._issue_t: dict[tuple[int, int], float] = {}
        self._done_t: dict[tuple[int, int], float] = {}
        self.log: collections.deque = collections.deque(maxlen=100_000)

    def reset(self, order: list[tuple[int, int]], codecs: list[str] | None = None) -> None:
        self.order = order
        self.codecs = codecs
        self.next_item = 0

    @property
    def measurers(self) -> int:
        """How many `start_measuring` calls are not yet stopped (readers of `log`)."""
        return self._requests

    def start_measuring(self) -> None:
        """Time every collective from now on (a fresh log) until the matching `stop_measuring`."""
        self._requests += 1
        self.measuring = True
        self.log.clear()

    def stop_measuring(self) -> None:
        assert self._requests > 0, "stop_measuring without start_measuring"
        self._requests -= 1
        self.measuring = self.recorder.enabled or self._requests > 0

    def issue_ready(self, buckets: list[FlatBucket]) -> None:
        """Issue every item whose bucket is ready, up to the first one that is not."""
        order = self.order
        while self.next_item < len(order):
            b, c = order[self.next_item]
            fb = buckets[b]
            if not fb.ready:
                return
            t = self.recorder.now()
            if self.measuring:
                self._issue_t[(b, c)] = t
            if self.comm is None:
                raise CaramelError(RELEASED)
            if self.codecs is None:
                work = self.comm.allreduce([fb.chunks[c]])
                nbytes = fb.chunks[c].numel() * fb.flat.element_size()
            else:
                work, nbytes = self.compressor.issue(self.comm, fb, c, self.codecs[b])
            fb.works[c] = work
            if self.measuring and work is not None:
                self.recorder.instant("comm", "issue", f"issue:b{b}c{c}", at=t, bucket=b, chunk=c)
                # the bytes on the wire (compressed), so the measured bandwidth is the link's
                work.get_future().add_done_callback(lambda _f, key=(b, c), n=nbytes: self._on_done(key, n))
            self.next_item += 1

    def all_issued(self) -> bool:
        return self.next_item == len(self.order)

    def _on_done(self, key: tuple[int, int], nbytes: int) -> None:
        # runs on the backend's thread: only appends (atomic under the GIL)
        now = time.perf_counter()
        self._done_t[key] = now
        self.log.append((self._issue_t.get(key, now), now, nbytes))

    def pop_times(self, key: tuple[int, int], default_issue: float) -> tuple[float, float | None]:
        """(issue, done) of a waited collective, for its trace event; done is None if not seen."""
        return self._issue_t.pop(key, default_issue), self._done_t.pop(key, None)

    def measured_bandwidth_bps(self, world_size: int, latency_s: float, queued_latency_s: float | None = None,
                               clear: bool = True) -> float | None:
        """`caramel.runtime.stats.bandwidth_from_log` over the collectives completed since the
        last call; `clear=False` keeps them for the next call."""
        log = list(self.log)
        if clear:
            self.log.clear()
        return bandwidth_from_log(log, world_size, latency_s, queued_latency_s)
