"""The ordered pull senders' broadcasts on the real gloo groups, logged (for the spawned tests).

`wire_logged()` wraps the senders' `SerialSender._issue`, which records ("issue", sender,
time, group, send) when a pull is handed to the backend (by the sender's thread, or by the
caller of `submit` when the sender was idle) and ("done", thread, time, group, send) once its
send is complete. `one_at_a_time` checks, per group and per issuing sender (a link), that no
two sends overlap in time: a sender that issued its async sends concurrently (on one group or
several), or two senders on one group, fail it. Per sender, not per thread: a hierarchical
leader's training thread may hand the first pull of both its senders over, one per link.
It checks what was handed to the backend and when it completed, not the order gloo put the
bytes on the socket.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Iterator

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
    issue = sender_mod.SerialSender._issue

    def logged_issue(sender, item):
        send = next(sends)
        log.append(("issue", id(sender), time.perf_counter(), id(item.group), send))
        return _Logged(issue(sender, item), log, id(item.group), send)

    sender_mod.SerialSender._issue = logged_issue
    try:
        yield log
    finally:
        sender_mod.SerialSender._issue = issue


def one_at_a_time(log: list) -> bool:
    """Every send was issued once and waited for once, and the sends' [issue, done] intervals
    are disjoint and follow each other per group and per issuing sender (a link): each send
    complete before the next one on that group, or from that sender, was issued. Two senders
    on two groups (a hierarchical leader's two) may overlap."""
    spans: dict[int, list] = {}  # send -> [issuing sender, group, issued, done]
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
    for key in (1, 0):  # per group, then per issuing sender
        by_key: dict[int, list[tuple[float, float]]] = {}
        for span in spans.values():
            by_key.setdefault(span[key], []).append((span[2], span[3]))
        for intervals in by_key.values():
            ordered = sorted(intervals)
            if any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:])):
                return False
    return True
