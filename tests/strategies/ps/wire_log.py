"""The ordered pull senders' broadcasts on the real gloo groups, logged (for the spawned tests).

`wire_logged()` swaps the sender module's `dist` for one whose `broadcast` records
("issue", thread, time) when a pull is handed to the backend and ("done", thread, time) once
its send is complete; `one_at_a_time` checks that each sender thread handed over its next
pull only after the previous one had left.
"""
from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace
from typing import Iterator

import torch.distributed as dist

from caramel.strategies.ps import sender as sender_mod


class _Logged:
    def __init__(self, work, log: list):
        self.work, self.log = work, log

    def wait(self):
        self.work.wait()
        self.log.append(("done", threading.get_ident(), time.perf_counter()))
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()


@contextlib.contextmanager
def wire_logged() -> Iterator[list]:
    log: list = []

    def broadcast(buf, src, group, async_op):
        log.append(("issue", threading.get_ident(), time.perf_counter()))
        return _Logged(dist.broadcast(buf, src=src, group=group, async_op=async_op), log)

    sender_mod.dist = SimpleNamespace(broadcast=broadcast, get_backend=dist.get_backend)
    try:
        yield log
    finally:
        sender_mod.dist = dist


def one_at_a_time(log: list) -> bool:
    """Per sending thread: issue, done, issue, done, ... (never two pulls in flight)."""
    threads: dict[int, list[str]] = {}
    for event, thread, _ in log:
        threads.setdefault(thread, []).append(event)
    return all(events == ["issue", "done"] * (len(events) // 2) and len(events) % 2 == 0
               for events in threads.values())
