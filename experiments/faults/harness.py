"""Run the fault worker on N local processes, hit one of them, and measure what the others do.

    job = LocalJob(JobConfig(world_size=2, worker_args=["--steps", "400"], timeout_s=10))
    with job:
        job.wait_for_step(rank=1, step=20)
        t = job.signal(1, signal.SIGKILL)
        outcome = job.wait(limit_s=60)

Workers are started directly (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT of a store this process hosts),
not under torchrun: torchrun's agent kills every worker as soon as one fails, which would hide
whether Caramel itself notices a dead or hung peer. Each worker runs in its own session, so a
signal reaches exactly one rank, and `close()` kills whatever is still alive, stopped ones too.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from caramel.cluster.local import worker_env
from caramel.distributed import host_store
from caramel.errors import CaramelError
from experiments.faults.worker import DONE_SUFFIX, PROGRESS_SUFFIX


@dataclass
class JobConfig:
    """One local job of the fault worker."""

    world_size: int = 2
    worker_args: list[str] = field(default_factory=list)  # for every rank
    rank_args: dict[int, list[str]] = field(default_factory=dict)  # extra, per rank
    rank_env: dict[int, dict[str, str]] = field(default_factory=dict)  # extra environment, per rank
    timeout_s: float = 10.0  # CARAMEL_TIMEOUT_S: how long a collective may wait on a silent peer
    out_dir: str = ""  # empty: a fresh temporary directory

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise CaramelError(f"world_size must be a positive integer, got {self.world_size!r}")
        if not self.timeout_s > 0:
            raise CaramelError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")


@dataclass
class RankOutcome:
    rank: int
    exit_code: int | None  # None: still running at the limit (then killed); negative: killed by that signal
    exit_time: float | None  # time.time() when its exit was seen
    stderr_tail: str
    done: dict | None  # the worker's result file, when it finished its steps


@dataclass
class JobOutcome:
    ranks: list[RankOutcome]
    hung: list[int]  # ranks still running at the limit


class LocalJob:
    """`world_size` fault workers on loopback; see the module docstring."""

    def __init__(self, config: JobConfig):
        self.config = config
        self._store = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        if config.out_dir:
            self.out = Path(config.out_dir)
            self.out.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="caramel-faults-")
            self.out = Path(self._tmp.name)
        self.procs: list[subprocess.Popen] = []
        self._stderr: list[Path] = []
        self._exit_time: dict[int, float] = {}

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> "LocalJob":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "LocalJob":
        cfg = self.config
        # Bound here before any worker starts (a port picked free and bound later by rank 0 can be
        # taken in between); the workers join it as clients, as under torchrun's agent.
        self._store = host_store(max(cfg.timeout_s, 60.0))
        env = worker_env(threads=1)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self._store.port), WORLD_SIZE=str(cfg.world_size),
                   TORCHELASTIC_USE_AGENT_STORE="True", CARAMEL_TIMEOUT_S=f"{cfg.timeout_s:g}")
        env.pop("CARAMEL_TRACE", None)
        for rank in range(cfg.world_size):
            renv = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), **cfg.rank_env.get(rank, {}))
            argv = [sys.executable, "-m", "experiments.faults.worker", "--out", str(self.out),
                    *cfg.worker_args, *cfg.rank_args.get(rank, [])]
            err_path = self.out / f"rank{rank}.stderr"
            self._stderr.append(err_path)
            with open(err_path, "wb") as err:
                self.procs.append(subprocess.Popen(argv, env=renv, stdout=subprocess.DEVNULL, stderr=err,
                                                   start_new_session=True))
        return self

    def close(self) -> None:
        """Kill every worker still alive (stopped ones included) and remove the temporary directory."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._store = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ---------------------------------------------------------------- observing
    def step_of(self, rank: int) -> int:
        """The last step rank `rank` reported finishing (0 before the first)."""
        path = self.out / f"rank{rank}{PROGRESS_SUFFIX}"
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return 0
        for line in reversed(lines):
            parts = line.split()
            if len(parts) == 3:  # the last line may be half-written
                return int(parts[0])
        return 0

    def wait_for_step(self, rank: int, step: int, limit_s: float = 120.0) -> None:
        """Block until `rank` has finished `step` steps; RuntimeError if it exits or takes longer."""
        deadline = time.monotonic() + limit_s
        while self.step_of(rank) < step:
            self._poll()
            if self.procs[rank].poll() is not None:
                raise RuntimeError(f"rank {rank} exited with {self.procs[rank].returncode} before step {step}:\n"
                                   + self.stderr_tail(rank))
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank} did not reach step {step} within {limit_s:g} s (at {self.step_of(rank)})")
            time.sleep(0.02)

    def stderr_tail(self, rank: int, max_chars: int = 4000) -> str:
        try:
            text = self._stderr[rank].read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text[-max_chars:]

    def _poll(self) -> None:
        now = time.time()
        for r, p in enumerate(self.procs):
            if r not in self._exit_time and p.poll() is not None:
                self._exit_time[r] = now

    # ---------------------------------------------------------------- acting
    def signal(self, rank: int, sig: int) -> float:
        """Send `sig` to rank `rank` (its process only); returns the time.time() it was sent."""
        t = time.time()
        os.kill(self.procs[rank].pid, sig)
        return t

    def wait(self, limit_s: float, ranks: list[int] | None = None) -> JobOutcome:
        """Wait until `ranks` (default all) exit or `limit_s` passes; the outcome of every rank."""
        ranks = list(range(self.config.world_size)) if ranks is None else ranks
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self._poll()
            if all(r in self._exit_time for r in ranks):
                break
            time.sleep(0.02)
        self._poll()
        hung = [r for r in ranks if r not in self._exit_time]
        outcomes = []
        for r, p in enumerate(self.procs):
            done_path = self.out / f"rank{r}{DONE_SUFFIX}"
            done = None
            if done_path.exists():
                import json
                done = json.loads(done_path.read_text())
            outcomes.append(RankOutcome(r, p.returncode, self._exit_time.get(r), self.stderr_tail(r), done))
        return JobOutcome(outcomes, hung)
