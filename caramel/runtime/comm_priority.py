"""CPU priority for the engine's communication threads.

A gloo collective advances only when the backend's threads of every rank get a core: each
ring step waits for the receiving rank's loop thread to wake, read and reduce. Where training
keeps every core busy (CPU training, or more ranks than cores), those threads queue behind
compute for each step of every collective. On the 2-core test host with 4 ranks computing
(`experiments/comm_priority.py`), an all-reduce took several times longer at normal priority
than with the threads at real-time priority, and a nice value on the computing thread did not
close the gap (docs/results/engine.md, "Communication thread priority, one collective"). So the
engine gives the threads of the backends it creates itself the lowest real-time priority
(`SCHED_FIFO`, 1): they preempt compute the moment a message arrives and block again at once.
They do a few copies and sums per byte.

A real-time thread that does not block starves everything else on its core, and gloo's tcp
loop can busy-spin (pytorch/gloo#246): seen here as a livelock, the raised loop threads of two
ranks taking both cores while the main threads that would end the spin waited for one (how
much slower a test ran: docs/results/engine-history.md, "Communication thread priority in
full"). So a governor (`_Governor`, one per process) watches the raised threads' CPU time: a
thread that used more than half a core over the last 50 ms goes back to normal priority for a
second, then is raised again. Normal use is a small share of a core (the same page), so the
governor stays out of the way until a thread spins.

It needs Linux and the privilege to set a real-time policy (root with CAP_SYS_NICE, or an
RLIMIT_RTPRIO of 2 or more, for the governor), and the kernel's real-time throttling on.
`comm_priority="auto"` uses it where allowed and otherwise keeps normal priority and records
why; `"realtime"` is an error where it is not allowed (found before anything is created:
`realtime_refused`); `"normal"` leaves the threads alone. Only native threads seen to start
while one of the engine's own backends was built are changed, never those of the process
group the user passed; torch DDP's only after a hand-over, on a group the engine made for it
(`caramel.strategies.caramel.handover`).
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, TypeVar

COMM_PRIORITIES = ("auto", "realtime", "normal")
REALTIME_PRIORITY = 1
GOVERNOR_PRIORITY = 2  # above the threads it watches, so that it runs while they spin
GOVERNOR_WINDOW_S = 0.05
GOVERNOR_MAX_CORE_SHARE = 0.5
GOVERNOR_REST_S = 1.0

T = TypeVar("T")


def realtime_refused() -> str | None:
    """Why this process cannot give its communication threads real-time priority with the
    governor above them, or None if it can. Tried on a short-lived thread of its own (at the
    governor's priority, the higher of the two), so nothing of the caller's changes."""
    if not hasattr(os, "sched_setscheduler") or _thread_ids() is None:
        return "real-time thread priority needs Linux (os.sched_setscheduler and /proc/self/task)"
    if _rt_throttling_off():
        return ("the kernel's real-time throttling is off (/proc/sys/kernel/sched_rt_runtime_us is -1): a "
                "communication thread that spins could then keep a core from everything else for good")
    refused: list[str] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(GOVERNOR_PRIORITY))
        except OSError as e:
            refused.append(f"setting SCHED_FIFO (priority {GOVERNOR_PRIORITY}) was refused ({e.strerror or e}); it "
                           f"needs root with CAP_SYS_NICE or RLIMIT_RTPRIO >= {GOVERNOR_PRIORITY} (ulimit -r)")

    t = threading.Thread(target=probe, name="caramel-rt-probe")
    t.start()
    t.join()
    return refused[0] if refused else None


def _rt_throttling_off() -> bool:
    try:
        with open("/proc/sys/kernel/sched_rt_runtime_us") as f:
            return f.read().strip() == "-1"
    except OSError:
        return False


@dataclass
class CommPriority:
    """What was asked (`mode`, one of `COMM_PRIORITIES`) and what the engine's communication
    threads got: `tids` the threads raised, `reason` why normal priority where real-time was
    asked for or allowed."""

    mode: str = "auto"
    reason: str | None = None
    tids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.mode in COMM_PRIORITIES, self.mode

    @classmethod
    def resolve(cls, mode: str) -> "CommPriority":
        """`mode` as this process can have it: for "auto" and "realtime", probe the privilege
        (`realtime_refused`) and keep the reason when refused."""
        prio = cls(mode)
        if mode != "normal":
            prio.reason = realtime_refused()
        return prio

    @property
    def allowed(self) -> bool:
        return self.mode != "normal" and self.reason is None

    @property
    def applied(self) -> str:
        """"realtime" once any thread was raised, else "normal"."""
        return "realtime" if self.tids else "normal"

    @property
    def threads(self) -> int:
        return len(self.tids)

    def start(self, build: Callable[[], T]) -> T:
        """Run `build`, which creates a communication backend, and give the threads it
        started real-time priority when allowed."""
        if not self.allowed:
            return build()
        before = _thread_ids() or set()
        result = build()
        # the backend's threads are native; a Python thread started meanwhile elsewhere in the
        # process (a logger, a checkpoint writer) is not the engine's to raise
        python_threads = {t.native_id for t in threading.enumerate()}
        raised = []
        for tid in sorted((_thread_ids() or set()) - before - python_threads):
            try:
                raise_thread(tid)
            except ProcessLookupError:
                continue  # a short-lived thread that has already ended
            except OSError as e:  # allowed a moment ago: keep what was raised, say why no more
                self.reason = f"setting SCHED_FIFO on thread {tid} was refused ({e.strerror or e})"
                break
            raised.append(tid)
        if raised:
            self.tids.extend(raised)
            governor().watch(raised)
        return result

    def to_dict(self) -> dict:
        """What the threads got, and how often the governor lowered one of them for a rest."""
        demotions = governor().demotions_of(self.tids) if self.tids else 0
        return {"mode": self.mode, "applied": self.applied, "reason": self.reason, "threads": self.threads,
                "demotions": demotions}


def raise_thread(tid: int) -> None:
    """Thread `tid` of this process to `SCHED_FIFO` `REALTIME_PRIORITY`."""
    # reset on fork: a thread it starts (an OpenMP team) is not raised, and not watched either
    os.sched_setscheduler(tid, os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0), os.sched_param(REALTIME_PRIORITY))


def lower_thread(tid: int) -> None:
    """Thread `tid` of this process back to normal priority."""
    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def _cpu_s(tid: int) -> float:
    """CPU time of thread `tid` of this process (Linux's per-thread CPU clock: (~tid << 3) | 6)."""
    return time.clock_gettime(((~tid) << 3) | 6)


class _Governor:
    """Puts a raised thread back to normal priority for `GOVERNOR_REST_S` when it used more than
    `GOVERNOR_MAX_CORE_SHARE` of a core over the last `GOVERNOR_WINDOW_S`, then raises it again.
    Runs on a daemon thread of its own at a higher real-time priority than the threads it
    watches (it sleeps between looks). It is Python, so it also needs the GIL: while raised
    threads spin on every core and a starved main thread holds the GIL, it gets its turn
    through the kernel's real-time throttling (5% of each core by default), within about a
    second; `realtime_refused` refuses where that throttling is off."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watched: dict[int, list] = {}  # tid -> [cpu_s, at_s, resting_until_s or None]
        self.demotions: dict[int, int] = {}  # tid -> times lowered for a rest
        self.thread: threading.Thread | None = None

    def watch(self, tids: list[int]) -> None:
        now = time.monotonic()
        clocks = {}
        for tid in tids:
            try:
                clocks[tid] = _cpu_s(tid)
            except OSError:
                continue  # already ended
        with self.lock:
            for tid, cpu in clocks.items():
                self.watched[tid] = [cpu, now, None]
            start = self.thread is None
            if start:
                self.thread = threading.Thread(target=self._run, name="caramel-comm-governor", daemon=True)
        if start:
            self.thread.start()

    def demotions_of(self, tids: list[int]) -> int:
        with self.lock:
            return sum(self.demotions.get(t, 0) for t in tids)

    def _run(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(GOVERNOR_PRIORITY))
        except OSError as e:  # probed before any thread was raised: only a changed limit gets here
            warnings.warn(f"caramel: the communication threads' governor runs at normal priority ({e}); a "
                          "spinning raised thread may then starve it", RuntimeWarning, stacklevel=1)
        while True:
            time.sleep(GOVERNOR_WINDOW_S)
            try:
                self.look(time.monotonic())
            except Exception as e:  # noqa: BLE001 - a guard that dies leaves the raised threads unguarded
                warnings.warn(f"caramel: the communication threads' governor failed a look ({e!r}); going on",
                              RuntimeWarning, stacklevel=1)

    def look(self, now: float) -> None:
        """One round: demote the threads that kept a core busy, raise the rested ones again;
        forget the threads that ended (their backend was destroyed)."""
        with self.lock:
            for tid, state in list(self.watched.items()):
                try:
                    cpu = _cpu_s(tid)
                except OSError:  # the thread ended: its clock is gone
                    del self.watched[tid]
                    continue
                share = (cpu - state[0]) / max(now - state[1], 1e-6)
                state[0], state[1] = cpu, now
                try:
                    if state[2] is None and share > GOVERNOR_MAX_CORE_SHARE:
                        lower_thread(tid)
                        state[2] = now + GOVERNOR_REST_S
                        self.demotions[tid] = self.demotions.get(tid, 0) + 1
                    elif state[2] is not None and now >= state[2]:
                        raise_thread(tid)
                        state[2] = None
                except ProcessLookupError:
                    del self.watched[tid]


_GOVERNOR: list[_Governor] = []
if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads, nor its governor
    os.register_at_fork(after_in_child=_GOVERNOR.clear)


def governor() -> _Governor:
    """This process's governor (made on first use: it watches OS threads, which are per process)."""
    if not _GOVERNOR:
        _GOVERNOR.append(_Governor())
    return _GOVERNOR[0]


def _thread_ids() -> set[int] | None:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return None
