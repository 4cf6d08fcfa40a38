"""Start one torchrun per node and supervise them as one job.

`torchrun_target()` turns a user command (`python train.py --lr 0.1`, `python -m pkg.mod`,
`./run.sh`) into torchrun's arguments, checking that the script or program exists first.
`supervise()` runs the node processes (each in its own session so it can be killed as a group),
streams their output with a node/rank prefix, and returns the worst exit code. When one node
fails, the others get `failure_grace_s` to notice and report it themselves (their messages name
the failed rank), then they are terminated; Ctrl-C terminates all of them and re-raises.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from caramel.errors import CaramelError

_PYTHON_RE = re.compile(r"python[0-9.]*")
_TEE_PREFIX = re.compile(r"\[default(\d+)\]:")
TERMINATE_GRACE_S = 5.0


def torchrun_target(cmd: list[str]) -> list[str]:
    """torchrun's trailing arguments for `cmd`; CaramelError if the command or script is missing."""
    if not cmd:
        raise CaramelError("command is empty; expected a program after `--`, e.g. `-- python train.py`")
    head, rest = cmd[0], list(cmd[1:])
    if _PYTHON_RE.fullmatch(os.path.basename(head)):
        if not rest:
            raise CaramelError(f"command {' '.join(cmd)!r} starts Python without a script; expected e.g. `python train.py`")
        if rest[0] == "-m":
            if len(rest) < 2:
                raise CaramelError("command `python -m` needs a module name, e.g. `python -m mypkg.train`")
            return ["-m"] + rest[1:]
        if rest[0].startswith("-"):
            # Interpreter options (-u, -c ...): run the same interpreter as we are, as given.
            return ["--no-python", sys.executable] + rest
        return [_existing_script(rest[0])] + rest[1:]
    if head.endswith(".py"):
        return [_existing_script(head)] + rest
    exe = head if os.sep in head else shutil.which(head)
    if exe is None or not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        raise CaramelError(f"program {head!r} not found or not executable; expected e.g. `python train.py`")
    return ["--no-python", os.path.abspath(exe) if os.sep in head else exe] + rest


def _existing_script(path: str) -> str:
    if not os.path.isfile(path):
        raise CaramelError(f"training script {path!r} does not exist (looked in {os.getcwd()})")
    return os.path.abspath(path)


def normalize_exit_code(code: int) -> int:
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - code if code < 0 else code


@dataclass
class NodeProcess:
    """One node's launcher process (torchrun, wrapped in `ip netns exec` on the emulated cluster)."""

    label: str
    argv: list[str]
    env: dict[str, str]
    rank_base: int | None = None  # global rank of this node's local rank 0, when torchrun tees per rank
    proc: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    lines: list[str] = field(default_factory=list)


def _pump(node: NodeProcess, out: TextIO, lock: threading.Lock, keep_lines: int) -> None:
    assert node.proc is not None and node.proc.stdout is not None
    for line in node.proc.stdout:
        m = _TEE_PREFIX.match(line) if node.rank_base is not None else None
        if m:  # torchrun --tee writes "[default<local rank>]:..."; show the global rank instead
            text = f"[rank{node.rank_base + int(m.group(1))}] {line[m.end():]}"
        else:
            text = f"[{node.label}] {line}" if node.label else line
        with lock:
            out.write(text)
            out.flush()
        node.lines.append(line)
        if len(node.lines) > keep_lines:
            del node.lines[: len(node.lines) - keep_lines]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(nodes: list[NodeProcess], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM each node's process group (torchrun forwards it to its workers), then SIGKILL after `grace_s`."""
    running = [n.proc for n in nodes if n.proc is not None and n.proc.poll() is None]
    for p in running:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while running and time.monotonic() < deadline:
        running = [p for p in running if p.poll() is None]
        time.sleep(0.05)
    for p in running:
        _signal_group(p, signal.SIGKILL)
    for n in nodes:
        if n.proc is not None:
            try:
                n.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def supervise(nodes: list[NodeProcess], out: TextIO | None = None, timeout_s: float | None = None,
              failure_grace_s: float = 10.0, keep_lines: int = 200) -> int:
    """Run all nodes to completion; return 0 or the worst exit code (124 on timeout)."""
    out = out if out is not None else sys.stdout
    lock = threading.Lock()
    start = time.monotonic()
    try:
        for n in nodes:
            n.proc = subprocess.Popen(n.argv, env=n.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace",
                                      start_new_session=True)
            n.reader = threading.Thread(target=_pump, args=(n, out, lock, keep_lines), daemon=True)
            n.reader.start()
        first_failure: float | None = None
        timed_out = False
        stopped: set[str] = set()
        while True:
            codes = [n.proc.poll() for n in nodes]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
            if first_failure is not None and now - first_failure > failure_grace_s:
                with lock:
                    out.write(f"caramel cluster: a node failed; stopping the others after {failure_grace_s:g} s\n")
                stopped = {n.label for n in nodes if n.proc.poll() is None}
                terminate(nodes)
                break
            if timeout_s is not None and now - start > timeout_s:
                with lock:
                    out.write(f"caramel cluster: job exceeded its {timeout_s:g} s limit; stopping all nodes\n")
                terminate(nodes)
                timed_out = True
                break
            time.sleep(0.05)
    except BaseException:
        # Ctrl-C, SIGTERM turned into an exception, or a failure to start: leave nothing running.
        terminate(nodes)
        raise
    finally:
        for n in nodes:
            if n.reader is not None:
                n.reader.join(timeout=5)
    if timed_out:
        return 124
    # The nodes we stopped only report our SIGTERM; the worst code among the others is the job's.
    codes = [worker_exit_code(n) for n in nodes
             if n.proc is not None and n.proc.returncode is not None and n.label not in stopped]
    return max(codes, default=1)


_ELASTIC_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def worker_exit_code(node: NodeProcess) -> int:
    """The node's exit code, or the worst worker exit code that torchrun reported for it.

    torchrun itself exits 1 whenever a worker fails; its failure summary ("exitcode  : 3")
    carries the worker's own code, which is what the user's script meant.
    """
    assert node.proc is not None and node.proc.returncode is not None
    code = normalize_exit_code(node.proc.returncode)
    if code == 1:
        reported = [normalize_exit_code(int(m.group(1))) for line in node.lines
                    if (m := _ELASTIC_EXITCODE.match(line))]
        reported = [c for c in reported if c != 0]
        if reported:
            return max(reported)
    return code
