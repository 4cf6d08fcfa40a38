"""A server's pulls, handed to the backend one at a time in the planned order.

Gloo runs each process group's collectives on two worker threads, so two broadcasts handed
over together are in flight at once and either may reach the wire first; a shard with two
pull buckets then has no order at all, and the first-needed bucket shares the link with the
second. The sender hands the next broadcast over only once the previous one has left (its
send is complete: the data is in the socket, so the link never idles for it), so the wire
order is the planned order. Receivers still post every receive at once: their "ready" notes
reach the server while the bucket before is on the wire. One thread per link that carries a
server's pulls, started at its first pull; each group sees its collectives one at a time,
from that thread or, for an idle sender's first pull, from the caller (below; the queue's
lock orders the two), never from two threads at once (the collectives of a group a sender
sends on are only this rank's broadcasts; a colocated server's pushes, point-to-point sends
from the training thread, share the group so that on each link they go ahead of the pulls,
`PsEngine.link_group`, and so do a server leader's node sums, sent from its
`hierarchy.NodeSumSender` thread; two threads on one gloo group is safe by gloo's internals,
not PyTorch's promise: a send runs in the calling thread,
never advances the collective counter, and the TCP pair is locked. A collective issued from
another thread on such a group while the sender has one in flight would not be):

- a colocated server's pulls to every worker (`engine.py`, flat colocated servers);
- a dedicated server process's pulls to the workers (`server.py`);
- hierarchical aggregation: the server leader's pulls to the other leaders, and each
  leader's relays of every pull to its node (a second sender: the node's link is another
  link, and a relay need not wait behind the server's sends to the other leaders).

An idle sender's first pull is handed to the backend by the caller itself (`submit`): woken
from the queue, the thread would need the GIL first, and right after `step()` the training
loop holds it (zero_grad, the next batch) for up to a switch interval or two; in a colocated
ResNet-18/16 run the first hand-off came 6.5-12 ms after the issue in 6 of 30 updates,
charged whole to the rank that waits for those pulls (docs/ps.md, "Where E is lost"; an
untimed run on a loaded host: under the bench lock the old hand-off took 0.4-2.6 ms and the
step time did not change, 0.998x). Only
when nothing is queued or on the wire: the calls on the group stay one after another, and
the thread waits for that send before it hands over the next.

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
        self.work: Any = None  # the backend's work, where the submitting thread issued it (`SerialSender.submit`)

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise CaramelError(f"ps: {self.what} failed: {self.error}") from self.error
        return True


class SerialSender:
    """Broadcasts from this rank, one at a time, in the order `submit` was called."""

    ISSUES_WHEN_IDLE = True  # the caller hands an idle sender's item to the backend itself

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[SentPull | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._unfinished = 0  # items submitted and not yet sent (or failed)
        self._failed = False
        self.issued: deque[int] = deque(maxlen=ISSUED_KEPT)  # the latest tags (pull buckets), in the order sent
        self.issued_by_caller = 0  # items the submitting thread handed to the backend (see the module docstring)

    def submit(self, buf: torch.Tensor, src: int, group: Any, tag: int = -1, what: str = "",
               after: Any = None) -> SentPull:
        item = SentPull(buf, src, group, tag, what or f"pull {tag}", after)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="caramel-ps-sender", daemon=True)
            self._thread.start()
        with self._lock:
            idle = self._unfinished == 0 and not self._failed
            self._unfinished += 1
        if idle and self.ISSUES_WHEN_IDLE and after is None:
            # nothing queued or on the wire: no call on the group can race this one, and the
            # thread waits for it before it issues anything submitted later
            self.issued.append(tag)
            self.issued_by_caller += 1
            try:
                item.work = self._issue(item)
            except BaseException as e:  # as a failure in the thread: this and every later item fail
                item.error = e
        self._queue.put(item)
        return item

    def _run(self) -> None:
        failed: SentPull | None = None
        while True:
            item = self._queue.get()
            if item is None:
                return
            if failed is None and item.error is None:
                try:
                    if item.work is None:
                        self.issued.append(item.tag)
                    self._send(item)
                except BaseException as e:  # handed to whoever waits for this pull (`SentPull.wait`)
                    item.error, failed = e, item
            elif failed is None:  # the caller's issue failed (`submit`)
                failed = item
            else:  # after a failure (a dead peer, a timeout) the rest are not sent: never a hang
                item.error = RuntimeError(f"not sent: the earlier {failed.what} failed ({failed.error})")
            with self._lock:
                self._unfinished -= 1
                self._failed = failed is not None
            item.done.set()

    def _issue(self, item: SentPull) -> Any:
        """Hand one pull to the backend (a measurement wraps this: the hand-off)."""
        return dist.broadcast(item.buf, src=item.src, group=item.group, async_op=True)

    def _send(self, item: SentPull) -> None:
        """One pull on the wire, returning once gloo holds it (issued here unless `submit` did)."""
        (item.work if item.work is not None else self._issue(item)).wait()

    def close(self) -> None:
        """Finish what was handed over, then stop the thread. The join has no time limit of its
        own: each broadcast the thread waits on ends by the pull group's timeout at the latest,
        and after a failure the rest end at once, so the groups are never destroyed under it."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
