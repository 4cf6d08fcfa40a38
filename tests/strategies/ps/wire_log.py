"""The ordered pull senders' broadcasts on the real gloo groups, logged (for the spawned tests).

`wire_logged()` swaps the sender module's `dist` for one whose `broadcast` records
("issue", thread, time, group, send) when a pull is handed to the backend and ("done", thread,
time, group, send) once its send is complete. `one_at_a_time` checks, per group, that no two
sends overlap in time: a sender that issued its async sends concurrently (from one thread or
from several) fails it. It checks what was handed to the backend and when it completed, not
the order gloo put the bytes on the socket.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from types import SimpleNamespace
from typing import Iterator

import torch.distributed as dist

from caramel.strategies.ps import sender as sender_mod


class _Logged:
    def __init__(self, work, log: list, group_key: int, send: int):
        self.work, self.log, self.group_key, self.send = work, log, group_key, send

    def wait(self):
        self.work.wait()
        self.log.append(("done", threading.get_ident(), time.perf_counter(), self.group_key, self.send))
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()


@contextlib.contextmanager
def wire_logged() -> Iterator[list]:
    log: list = []
    sends = itertools.count()

    def broadcast(buf, src, group, async_op):
        send = next(sends)
        log.append(("issue", threading.get_ident(), time.perf_counter(), id(group), send))
        return _Logged(dist.broadcast(buf, src=src, group=group, async_op=async_op), log, id(group), send)

    sender_mod.dist = SimpleNamespace(broadcast=broadcast, get_backend=dist.get_backend)
    try:
        yield log
    finally:
        sender_mod.dist = dist


def one_at_a_time(log: list) -> bool:
    """Every send was waited for, and per group the sends' [issue, done] intervals are disjoint
    and follow each other: each send complete before the next one on that group was issued."""
    spans: dict[int, dict[int, list[float]]] = {}
    for event, _thread, t, group_key, send in log:
        span = spans.setdefault(group_key, {}).setdefault(send, [])
        if (event == "issue") != (len(span) == 0):
            return False
        span.append(t)
    for per_send in spans.values():
        ordered = sorted(per_send.values())
        if any(len(s) != 2 for s in ordered):
            return False
        if any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:])):
            return False
    return True
