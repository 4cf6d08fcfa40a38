"""The ordered pull senders' broadcasts on the real gloo groups, logged (for the spawned tests).

`wire_logged()` swaps the sender module's `dist` for one whose `broadcast` records
("issue", thread, time, group, send) when a pull is handed to the backend and ("done", thread,
time, group, send) once its send is complete. `one_at_a_time` checks, per group and per issuing
thread, that no two sends overlap in time: a sender that issued its async sends concurrently
(from one thread, on one group or several, or from several threads on one group) fails it. It checks what was handed to the backend and when it completed, not
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
    """Every send was issued once and waited for once, and the sends' [issue, done] intervals
    are disjoint and follow each other per group and per issuing thread (a sender's link): each
    send complete before the next one on that group, or from that thread, was issued. Two
    threads on two groups (a hierarchical leader's two senders) may overlap."""
    spans: dict[int, list] = {}  # send -> [issuing thread, group, issued, done]
    for event, thread, t, group_key, send in log:
        if event == "issue":
            if send in spans:
                return False
            spans[send] = [thread, group_key, t]
        elif event == "done":
            span = spans.get(send)
            if span is None or len(span) != 3 or span[1] != group_key:
                return False
            span.append(t)
        else:
            return False
    if any(len(span) != 4 for span in spans.values()):
        return False
    for key in (1, 0):  # per group, then per issuing thread
        by_key: dict[int, list[tuple[float, float]]] = {}
        for span in spans.values():
            by_key.setdefault(span[key], []).append((span[2], span[3]))
        for intervals in by_key.values():
            ordered = sorted(intervals)
            if any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:])):
                return False
    return True
