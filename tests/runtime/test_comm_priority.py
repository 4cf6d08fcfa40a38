"""The engine's communication threads at real-time priority (`caramel.runtime.comm_priority`):
only the threads a backend started are raised, a refused privilege is a reason (auto) or an
error (realtime), and a run keeps the priority it got in its stats."""
import os
import threading
import time

import pytest
import torch

import caramel
from caramel.errors import CaramelError, MismatchError
from caramel.runtime import comm_priority as cp
from caramel.testing import run_workers

needs_rt = pytest.mark.skipif(cp.realtime_refused() is not None,
                              reason=f"this process may not set real-time priority: {cp.realtime_refused()}")


def _start_sleeper():
    """A backend stand-in: starts one thread that blocks until released."""
    release, started = threading.Event(), threading.Event()
    tid: list[int] = []

    def run():
        tid.append(threading.get_native_id())
        started.set()
        release.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    started.wait(10)
    return t, release, tid


def _names_once_renamed(tids: list[int], expected: list[str], deadline_s: float = 10.0) -> dict[int, str]:
    """The threads' names, read until they are `expected` or the deadline passes: a backend's
    thread names itself after it starts, so a read right after the start may see the name it
    inherited."""
    end = time.monotonic() + deadline_s
    while True:
        names = {t: open(f"/proc/self/task/{t}/comm").read().strip() for t in tids}
        if sorted(names.values()) == sorted(expected) or time.monotonic() > end:
            return names
        time.sleep(0.01)


def _policy(tid: int) -> int:
    return os.sched_getscheduler(tid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)


@needs_rt
def test_only_the_threads_the_backend_started_are_raised():
    """A real gloo backend (one process) built while a Python thread of someone else's starts:
    the backend's native threads are raised and watched, the Python thread and the caller not."""
    import torch.distributed as dist

    from caramel.distributed import gloo_group

    main_policy = _policy(0)
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    prio = cp.CommPriority.resolve("auto")
    others = []

    def build():
        others.append(_start_sleeper())  # e.g. a logger's thread, started meanwhile
        return gloo_group("test-priority")

    try:
        pg = prio.start(build)
        names = _names_once_renamed(prio.tids, ["gloo_tcp_loop", "pt_gloo_runloop"])
        assert sorted(names.values()) == ["gloo_tcp_loop", "pt_gloo_runloop"], names
        assert prio.applied == "realtime" and prio.threads == 2 and prio.reason is None
        for tid in prio.tids:
            assert _policy(tid) == os.SCHED_FIFO
            assert os.sched_getparam(tid).sched_priority == cp.REALTIME_PRIORITY
            assert tid in cp.governor().watched
        _, release, other_tid = others[0]
        assert _policy(other_tid[0]) == main_policy and _policy(0) == main_policy
        release.set()
        del pg
    finally:
        dist.destroy_process_group()


@needs_rt
def test_the_governor_lowers_a_spinning_thread_and_raises_it_again_after_its_rest():
    stop = threading.Event()
    tids: list[int] = []

    def spin():
        tids.append(threading.get_native_id())
        while not stop.is_set():
            pass

    def sleep():
        tids.append(threading.get_native_id())
        stop.wait(10)

    threads = [threading.Thread(target=f, daemon=True) for f in (spin, sleep)]
    for t in threads:
        t.start()
    try:
        while len(tids) < 2:
            time.sleep(0.001)
        spinner, sleeper = tids
        for tid in tids:
            cp.raise_thread(tid)
        gov = cp._Governor()  # not started: looked at by hand, so that the test owns the clock
        t0 = time.monotonic()
        gov.watched = {tid: [cp._cpu_s(tid), t0, None] for tid in tids}
        time.sleep(0.2)
        now = time.monotonic()
        gov.look(now)
        assert gov.demotions_of([spinner]) == 1 and gov.demotions_of([sleeper]) == 0
        assert _policy(spinner) == os.SCHED_OTHER
        assert _policy(sleeper) == os.SCHED_FIFO
        gov.look(now + cp.GOVERNOR_REST_S / 2)  # still resting, though it spins on
        assert _policy(spinner) == os.SCHED_OTHER and gov.demotions_of([spinner]) == 1
        gov.look(now + cp.GOVERNOR_REST_S)
        assert _policy(spinner) == os.SCHED_FIFO
    finally:
        stop.set()
        for t in threads:
            t.join()
    gov.look(time.monotonic() + 10)  # ended threads are forgotten
    assert gov.watched == {}


def test_refused_privilege_is_a_reason_for_auto_and_nothing_is_changed(monkeypatch):
    calls = []

    def refuse(*args):
        calls.append(args)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    reason = cp.realtime_refused()
    assert reason is not None and "CAP_SYS_NICE" in reason and "RLIMIT_RTPRIO" in reason
    prio = cp.CommPriority.resolve("auto")
    assert not prio.allowed and prio.reason == reason
    calls.clear()
    t, release, _ = prio.start(_start_sleeper)
    release.set()
    assert calls == [] and prio.applied == "normal" and prio.threads == 0
    assert prio.to_dict() == {"mode": "auto", "applied": "normal", "reason": reason, "threads": 0, "demotions": 0}


def test_normal_does_not_probe(monkeypatch):
    monkeypatch.setattr(cp, "realtime_refused", lambda: pytest.fail("probed for mode normal"))
    prio = cp.CommPriority.resolve("normal")
    t, release, tid = prio.start(_start_sleeper)
    release.set()
    assert prio.to_dict() == {"mode": "normal", "applied": "normal", "reason": None, "threads": 0, "demotions": 0}


@pytest.mark.parametrize("bad", ["fast", "", None, 1, "Realtime"])
def test_bad_comm_priority_is_named(bad):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CaramelError, match="comm_priority must be one of auto, realtime, normal"):
        caramel.parallelize(model, opt, comm_priority=bad)


def _priority_worker(rank: int, world: int, mode: str, refuse_on: int | None) -> dict:
    from caramel.runtime import comm_priority

    if refuse_on == rank:
        comm_priority.realtime_refused = lambda: "refused for the test"
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        model, opt = caramel.parallelize(model, opt, comm_priority=mode, overlap="backward", profile_steps=1)
    except MismatchError as e:
        return {"error": str(e)}
    for step in range(4):
        torch.manual_seed(step * 10 + rank)
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    threads = {}
    for t in os.listdir("/proc/self/task"):
        try:
            policy = _policy(int(t))
            name = open(f"/proc/self/task/{t}/comm").read().strip()
            if os.sched_getparam(int(t)).sched_priority == cp.GOVERNOR_PRIORITY:
                name = "governor"  # Python names no OS thread before 3.14
        except OSError:
            continue
        threads.setdefault(policy, []).append(name)
    return {"stats": opt.engine.stats_dict()["comm_priority"], "threads": threads,
            "main": _policy(0)}


@needs_rt
@pytest.mark.timeout(120)
def test_a_run_raises_its_own_backends_threads_only():
    for res in run_workers(_priority_worker, 2, args=("auto", None), timeout_s=100):
        stats = res["stats"]
        # the gradient backend and the buffer broadcast's: a loop thread and a worker thread each
        assert stats["applied"] == "realtime" and stats["threads"] == 4 and stats["reason"] is None, stats
        # and the governor that watches them
        assert sorted(res["threads"][os.SCHED_FIFO]) == ["gloo_tcp_loop"] * 2 + ["governor"] + ["pt_gloo_runloop"] * 2
        assert res["main"] == os.SCHED_OTHER
        # the job's own process group (the one the user made) keeps its threads as they were
        assert "pt_gloo_runloop" in res["threads"][os.SCHED_OTHER]


@pytest.mark.timeout(120)
def test_normal_leaves_every_thread_alone():
    for res in run_workers(_priority_worker, 2, args=("normal", None), timeout_s=100):
        assert res["stats"] == {"mode": "normal", "applied": "normal", "reason": None, "threads": 0, "demotions": 0}
        assert os.SCHED_FIFO not in res["threads"]


@needs_rt  # elsewhere rank 0 is refused as well, and the error names the first rank refused
@pytest.mark.timeout(120)
def test_realtime_refused_on_one_rank_is_one_error_on_every_rank():
    results = run_workers(_priority_worker, 2, args=("realtime", 1), timeout_s=100)
    for res in results:
        assert "rank 1: comm_priority='realtime': refused for the test" in res["error"], res
        assert "comm_priority='auto'" in res["error"]


@pytest.mark.timeout(120)
def test_auto_refused_on_one_rank_trains_at_normal_priority_there():
    results = run_workers(_priority_worker, 2, args=("auto", 1), timeout_s=100)
    assert results[1]["stats"] == {"mode": "auto", "applied": "normal", "reason": "refused for the test", "threads": 0,
                                   "demotions": 0}
    assert os.SCHED_FIFO not in results[1]["threads"]


def test_no_real_time_where_the_kernel_does_not_throttle_it(monkeypatch):
    # the governor is Python and gets its turn through the throttling: without it, no guard
    monkeypatch.setattr(cp, "_rt_throttling_off", lambda: True)
    reason = cp.realtime_refused()
    assert reason is not None and "sched_rt_runtime_us is -1" in reason
