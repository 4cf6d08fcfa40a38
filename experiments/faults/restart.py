"""Restarts: `caramel train --max-restarts 1` with a worker SIGKILLed from outside mid-run.

torchrun notices the dead worker, stops the others and starts the group again; the restarted
workers resume from the newest valid checkpoint. The promise: the run finishes and its final
parameters are bit-identical to those of an undisturbed run with the same config, so the only
loss is the work redone since the checkpoint.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from caramel.errors import CaramelError
from experiments.faults.result import FaultResult, MatrixConfig, fault, shorten

# digits: 25 steps per epoch at 2 x 32; a checkpoint every 10 steps
TRAIN_ARGS = ["--workload", "digits", "--workers", "2", "--cluster", "off", "--batch-size", "32", "--steps", "40", "--checkpoint-every", "10",
              "--warmup-steps", "3", "--lr", "0.01", "--log-every-steps", "10", "--val-every-steps", "0"]
RUN_LIMIT_S = 300.0


def _repo() -> str:
    import caramel
    return str(Path(list(caramel.__path__)[0]).resolve().parent)


def _start(out: Path, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=_repo())
    argv = [sys.executable, "-m", "caramel.cli", "train", *TRAIN_ARGS, *extra, "--out-dir", str(out)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, limit_s: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=limit_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def worker_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the training worker with RANK=`rank` under `launcher_pid` (torchrun's child)."""
    for pid in descendants(launcher_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"caramel.cli" in cmd and b"torch.distributed.run" not in cmd:
            return pid
    return None


def final_model(out: Path, step: int) -> dict:
    from caramel.train import checkpoint as ckpt
    return ckpt.load(ckpt.checkpoint_path(out / "checkpoints", step))["model"]


def restart_experiment(kill_after_checkpoint: int = 10, victim: int = 1) -> dict:
    """An undisturbed run, then the same run with `victim` SIGKILLed just after checkpoint
    `kill_after_checkpoint` appears; compare the final checkpoints tensor by tensor."""
    import torch
    with tempfile.TemporaryDirectory(prefix="caramel-restart-") as tmp:
        base, hit = Path(tmp) / "base", Path(tmp) / "hit"
        rc_base, log_base = _finish(_start(base, []), RUN_LIMIT_S)
        proc = _start(hit, ["--max-restarts", "1"])
        marker = hit / "checkpoints" / f"ckpt-{kill_after_checkpoint:09d}"
        deadline = time.monotonic() + RUN_LIMIT_S
        killed_pid, t_kill = None, None
        while time.monotonic() < deadline and proc.poll() is None:
            if marker.is_dir():
                killed_pid = worker_pid(proc.pid, victim)
                if killed_pid is not None:
                    os.kill(killed_pid, signal.SIGKILL)
                    t_kill = time.time()
                    break
            time.sleep(0.05)
        rc_hit, log_hit = _finish(proc, max(1.0, deadline - time.monotonic()))
        t_end = time.time()
        identical, max_diff, error = None, None, ""
        try:
            total = int(TRAIN_ARGS[TRAIN_ARGS.index("--steps") + 1])
            a, b = final_model(base, total), final_model(hit, total)
            identical = all(torch.equal(a[k], b[k]) for k in a) and set(a) == set(b)
            max_diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
        except (CaramelError, KeyError) as e:
            error = str(e)
        resumed = [line for line in log_hit.splitlines() if "resuming from" in line]
    return {"rc_base": rc_base, "rc_hit": rc_hit, "killed_pid": killed_pid, "kill_after_checkpoint": kill_after_checkpoint,
            "recover_s": (t_end - t_kill) if t_kill else None, "identical": identical, "max_abs_diff": max_diff,
            "error": error, "resumed_line": resumed[-1] if resumed else "",
            "log_tail": log_hit[-3000:], "base_log_tail": log_base[-1500:] if rc_base != 0 else ""}


@fault("torchrun-restart", "restart", slow=True)
def torchrun_restart(cfg: MatrixConfig) -> FaultResult:
    raw = restart_experiment()
    ok = raw["rc_base"] == 0 and raw["rc_hit"] == 0 and raw["killed_pid"] is not None and bool(raw["identical"])
    return FaultResult(
        fault="torchrun-restart", category="restart",
        injected=f"`caramel train --max-restarts 1` (digits, 2 workers, 40 steps): SIGKILL rank 1 right after checkpoint "
                 f"{raw['kill_after_checkpoint']} is written",
        expected="torchrun restarts the workers, they resume from the last checkpoint, final parameters bit-identical "
                 "to an undisturbed run",
        detected=raw["killed_pid"] is not None and raw["rc_hit"] == 0, detect_s=None, exit_codes=[raw["rc_base"], raw["rc_hit"]],
        message=shorten(raw["resumed_line"] or raw["error"]),
        recovered=("yes, bit-identical final parameters" if raw["identical"] else
                   f"no (max |diff| {raw['max_abs_diff']})" if raw["identical"] is False else "no"),
        data_lost="none (work since the checkpoint is redone)" if raw["identical"] else "see notes",
        passed=ok, notes=(f"kill to finished run: {raw['recover_s']:.1f} s" if raw["recover_s"] else "worker never killed"),
        details=raw)
