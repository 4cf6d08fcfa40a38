"""A colocated server's pulls, handed to the backend one at a time in the planned order.

Gloo runs each process group's collectives on two worker threads, so two broadcasts handed
over together are in flight at once and either may reach the wire first; a shard with two
pull buckets then has no order at all, and the first-needed bucket shares the link with the
second. The sender hands the next broadcast over only once the previous one has left (its
send is complete: the data is in the socket, so the link never idles for it), so the wire
order is the planned order. Receivers still post every receive at once: their "ready" notes
reach the server while the bucket before is on the wire. One thread per engine, started at
the first pull; each group sees its collectives from one thread only (the server's own
shard's pull group carries only its sends).
"""
from __future__ import annotations

import queue
import threading
from typing import Any

import torch
import torch.distributed as dist

SENDER_JOIN_S = 5.0  # at close: how long to wait for the thread to finish what it was handed


class SentPull:
    """One broadcast handed to the sender: waited on like a backend work."""

    def __init__(self, buf: torch.Tensor, src: int, group: Any, tag: int):
        self.buf, self.src, self.group, self.tag = buf, src, group, tag
        self.done = threading.Event()
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True


class SerialSender:
    """Broadcasts from this rank, one at a time, in the order `submit` was called."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[SentPull | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.issued: list[int] = []  # the tags (pull buckets), in the order handed to the backend

    def submit(self, buf: torch.Tensor, src: int, group: Any, tag: int = -1) -> SentPull:
        item = SentPull(buf, src, group, tag)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="caramel-ps-sender", daemon=True)
            self._thread.start()
        self._queue.put(item)
        return item

    def _run(self) -> None:
        failed: BaseException | None = None
        while True:
            item = self._queue.get()
            if item is None:
                return
            if failed is None:  # after a failure (a dead peer, a timeout) the rest fail alike, never hang
                try:
                    self.issued.append(item.tag)
                    dist.broadcast(item.buf, src=item.src, group=item.group, async_op=True).wait()
                except BaseException as e:  # handed to whoever waits for this pull
                    failed = e
            item.error = failed
            item.done.set()

    def close(self) -> None:
        """Finish what was handed over, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(SENDER_JOIN_S)
            self._thread = None
