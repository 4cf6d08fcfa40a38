"""A server's pulls, handed to the backend one at a time in the planned order.

Gloo runs each process group's collectives on two worker threads, so two broadcasts handed
over together are in flight at once and either may reach the wire first; a shard with two
pull buckets then has no order at all, and the first-needed bucket shares the link with the
second. The sender hands the next broadcast over only once the previous one has left (its
send is complete: the data is in the socket, so the link never idles for it), so the wire
order is the planned order. Receivers still post every receive at once: their "ready" notes
reach the server while the bucket before is on the wire. One thread per link that carries a
server's pulls, started at its first pull; each group sees its collectives from one thread
only (the collectives of a group a sender sends on are only this rank's broadcasts; a
colocated server's pushes, point-to-point sends from the training thread, share the group so
that on each link they go ahead of the pulls, `PsEngine.link_group`, and so do a server
leader's node sums, sent from its `hierarchy.NodeSumSender` thread; two threads on one gloo
group is safe by gloo's internals, not PyTorch's promise: a send runs in the calling thread,
never advances the collective counter, and the TCP pair is locked. A collective issued from
another thread on such a group would not be):

- a colocated server's pulls to every worker (`engine.py`, flat colocated servers);
- a dedicated server process's pulls to the workers (`server.py`);
- hierarchical aggregation: the server leader's pulls to the other leaders, and each
  leader's relays of every pull to its node (a second sender: the node's link is another
  link, and a relay need not wait behind the server's sends to the other leaders).

Gloo only: on NCCL a second thread issuing on one of several communicators of the same device
is unsafe, every rank must launch a device's collectives in the same order, `wait()` does not
block the host (so the thread would order nothing), and NCCL runs one group's collectives in
order on its stream anyway. The engine uses the sender only when every pull group is gloo and
broadcasts from the main thread otherwise (`uses_sender`, `send_pull`).
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from caramel.errors import CaramelError

ISSUED_KEPT = 1024  # the latest tags handed to the backend, kept for inspection


def uses_sender(groups: list[Any]) -> bool:
    """The ordered sender thread only where every pull group is gloo (see the module docstring)."""
    return bool(groups) and all(dist.get_backend(g) == "gloo" for g in groups)


def send_pull(sender: "SerialSender | None", buf: torch.Tensor, src: int, group: Any, tag: int, what: str) -> Any:
    """One pull from this rank: through the ordered `sender` where there is one (gloo), else
    handed to the backend at once (NCCL runs a group's collectives in order on its stream)."""
    if sender is not None:
        return sender.submit(buf, src, group, tag, what)
    return dist.broadcast(buf, src=src, group=group, async_op=True)


class SentPull:
    """One broadcast handed to the sender: waited on like a backend work; `what` names it in errors."""

    def __init__(self, buf: torch.Tensor, src: int, group: Any, tag: int, what: str, after: Any = None):
        self.buf, self.src, self.group, self.tag, self.what = buf, src, group, tag, what
        self.after = after  # a backend work to wait for before sending (`hierarchy.NodeSumSender`)
        self.done = threading.Event()
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise CaramelError(f"ps: {self.what} failed: {self.error}") from self.error
        return True


class SerialSender:
    """Broadcasts from this rank, one at a time, in the order `submit` was called."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[SentPull | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.issued: deque[int] = deque(maxlen=ISSUED_KEPT)  # the latest tags (pull buckets), in the order sent

    def submit(self, buf: torch.Tensor, src: int, group: Any, tag: int = -1, what: str = "",
               after: Any = None) -> SentPull:
        item = SentPull(buf, src, group, tag, what or f"pull {tag}", after)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="caramel-ps-sender", daemon=True)
            self._thread.start()
        self._queue.put(item)
        return item

    def _run(self) -> None:
        failed: SentPull | None = None
        while True:
            item = self._queue.get()
            if item is None:
                return
            if failed is None:
                try:
                    self.issued.append(item.tag)
                    self._send(item)
                except BaseException as e:  # handed to whoever waits for this pull (`SentPull.wait`)
                    item.error, failed = e, item
            else:  # after a failure (a dead peer, a timeout) the rest are not sent: never a hang
                item.error = RuntimeError(f"not sent: the earlier {failed.what} failed ({failed.error})")
            item.done.set()

    def _send(self, item: SentPull) -> None:
        """One pull on the wire, returning once gloo holds it (a measurement wraps this)."""
        dist.broadcast(item.buf, src=item.src, group=item.group, async_op=True).wait()

    def close(self) -> None:
        """Finish what was handed over, then stop the thread. The join has no time limit of its
        own: each broadcast the thread waits on ends by the pull group's timeout at the latest,
        and after a failure the rest end at once, so the groups are never destroyed under it."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
