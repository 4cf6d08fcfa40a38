"""Helpers for multi-process tests: spawn N workers on loopback, collect their results, never hang.

    results = run_workers(fn, world_size=2, args=(...), timeout_s=120)

Each worker calls `fn(rank, world_size, *args)` after `init_distributed`, joining a store the
caller hosts on a port the kernel picked (no free-port race), with one compute thread. Return values come back in rank order. A worker that raises makes
`run_workers` raise with that worker's traceback; a job that exceeds `timeout_s` is killed.

Workers are forked from a multiprocessing forkserver that imported torch and torch._dynamo
(which the first optimizer step imports) once: a fresh process each, without the seconds of
CPU per worker those imports cost, which on a small host is most of a short test's time. Each
worker takes the caller's current environment, working directory and sys.path, as a spawned
one would.
"""
from __future__ import annotations

import os
import queue
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from caramel.distributed import host_store

PRELOAD = ("torch", "torch.distributed", "torch._dynamo")
"""imported by the forkserver before it forks any worker"""


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple, out: Any, timeout_s: float,
            env: dict[str, str]) -> None:
    # the caller's environment as it is now, as a spawned process would see it (a forked
    # worker starts with the forkserver's, copied when the server started)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", TORCHELASTIC_USE_AGENT_STORE="True")
    import torch
    import torch.distributed as dist

    from caramel.distributed import init_distributed

    torch.set_num_threads(1)
    try:
        init_distributed(backend="gloo", timeout_s=timeout_s)
        result = fn(rank, world, *args)
        out.put((rank, "ok", result))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def run_workers(fn: Callable, world_size: int, args: tuple = (), timeout_s: float = 120.0,
                collective_timeout_s: float = 30.0) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` spawned processes; return results by rank."""
    ctx = mp.get_context("forkserver")
    # before the server's first start (later calls change nothing): the server imports these once
    ctx.set_forkserver_preload(list(PRELOAD))
    out = ctx.Queue()
    store = host_store(timeout_s)  # bound before any worker starts; serves until this call returns
    port = store.port
    env = dict(os.environ)
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, out, collective_timeout_s, env),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    import time
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"workers did not finish within {timeout_s} s (done: {sorted(results)}, failed: {sorted(errors)})")
            try:
                rank, status, payload = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results and r not in errors]
                if dead and all(p.exitcode not in (0, None) for r, p in enumerate(procs) if r in dead):
                    # a worker died without reporting (killed); give the others a moment to report
                    time.sleep(0.5)
                    if out.empty():
                        raise RuntimeError(f"worker(s) {dead} died with exit codes {[procs[r].exitcode for r in dead]}")
                continue
            (results if status == "ok" else errors)[rank] = payload
            if errors:
                break
    finally:
        for p in procs:
            p.join(timeout=2.0 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if errors:
        rank = min(errors)
        raise RuntimeError(f"worker {rank} failed:\n{errors[rank]}")
    return [results[r] for r in range(world_size)]
