"""Workers on this machine: the environment every launched worker gets, and N plain processes on
loopback under one supervisor.

Every launcher (the bench, `caramel train`, the emulated cluster, the experiments) starts its
workers with `worker_env`, so they import the same `caramel` as the launcher, installed or not
(torchrun puts the script's directory first on `sys.path`, not the working directory), and run
one compute thread each unless the user chose otherwise: two workers on a 2-core host must not
fight over cores.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

import caramel
from caramel.cluster.launch import NodeProcess, supervise


def repo_root() -> str:
    """The directory that holds the `caramel` package (and `experiments/` in a checkout)."""
    return str(Path(list(caramel.__path__)[0]).resolve().parent)


def worker_env(threads: int | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (our environment) plus: `caramel` importable from `repo_root()` first, unbuffered
    output, and `threads` compute threads (None: 1 unless OMP_NUM_THREADS is already set)."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    root = repo_root()
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    if threads is None:
        env.setdefault("OMP_NUM_THREADS", "1")
    else:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_local(workers: int, argv: list[str], timeout_s: float | None, out: TextIO | None = None,
              threads: int | None = 1, extra_env: dict[str, str] | None = None) -> tuple[int, list[NodeProcess]]:
    """`python argv...` as `workers` local processes with torchrun's environment variables on
    127.0.0.1 (no torchrun: one torch import less per job), supervised as one job: a wall-clock
    limit, the others stopped shortly after one fails. Returns the worst exit code and the nodes
    (each keeps its last output lines)."""
    from caramel.distributed import host_store

    store = host_store(timeout_s or 300.0)  # bound before any worker starts; serves until they end
    nodes = []
    for rank in range(workers):
        env = worker_env(threads)
        env.update(extra_env or {})
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_WORLD_SIZE=str(workers),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                   TORCHELASTIC_USE_AGENT_STORE="True")
        nodes.append(NodeProcess(f"rank{rank}", [sys.executable] + argv, env))
    try:
        return supervise(nodes, out=out, timeout_s=timeout_s), nodes
    finally:
        del store
