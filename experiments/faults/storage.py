"""Storage faults: checkpoints damaged after they were written (bit flip, truncation, lost files).

Each experiment writes two real checkpoints with `caramel.train.checkpoint.save` (steps 10 and
20), damages the newer one, and checks three promises: loading it directly raises CaramelError
naming the checkpoint and what is wrong (never a half-load, never another exception type),
`latest_valid` falls back to the older intact checkpoint (data lost: the 10 steps between),
and `caramel train --resume <damaged>` exits 2 with one error line and no traceback.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from caramel.errors import CaramelError
from experiments.faults.result import FaultResult, MatrixConfig, fault, shorten

OLD_STEP, NEW_STEP = 10, 20


def _state(step: int) -> dict:
    import torch

    from caramel.train import checkpoint as ckpt
    from caramel.train.config import TrainConfig
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"step": step, "epoch": 0, "index": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": {}, "rng": [ckpt.rng_state()], "config": TrainConfig().to_dict()}


def flip_byte(path: Path) -> None:
    """Invert one byte in the middle of the file (a silent disk or copy error)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate_half(path: Path) -> None:
    """Keep the first half of the file (a copy or write cut short)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def checkpoint_experiment(damage: Callable[[Path], None], cli: bool = True) -> dict:
    """Write checkpoints 10 and 20, damage 20 with `damage(ckpt_dir)`, observe load/fallback/CLI."""
    from caramel.train import checkpoint as ckpt
    with tempfile.TemporaryDirectory(prefix="caramel-ckpt-fault-") as tmp:
        root = Path(tmp)
        for step in (OLD_STEP, NEW_STEP):
            ckpt.save(root, step, _state(step), world_size=1, keep_last=5)
        bad = ckpt.checkpoint_path(root, NEW_STEP)
        damage(bad)
        t0 = time.perf_counter()
        error, error_type = "", ""
        try:
            ckpt.load(bad)
        except CaramelError as e:
            error, error_type = str(e), "CaramelError"
        except Exception as e:  # noqa: BLE001 - measured: any other type is a failure of the promise
            error, error_type = f"{type(e).__name__}: {e}", type(e).__name__
        detect_s = time.perf_counter() - t0
        found = ckpt.latest_valid(root)
        fallback_step = int(found[1]["step"]) if found else None
        cli_rc, cli_stderr = None, ""
        if cli:
            cli_rc, cli_stderr = _resume_cli(bad)
    return {"error": error, "error_type": error_type, "detect_s": detect_s, "fallback_step": fallback_step,
            "cli_rc": cli_rc, "cli_stderr": cli_stderr}


def _resume_cli(bad: Path) -> tuple[int, str]:
    """`caramel train --resume <bad>`: must refuse before starting workers."""
    import caramel
    repo = str(Path(list(caramel.__path__)[0]).resolve().parent)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=repo)
    with tempfile.TemporaryDirectory(prefix="caramel-ckpt-cli-") as out:
        proc = subprocess.run([sys.executable, "-m", "caramel.cli", "train", "--workload", "digits", "--workers", "1",
                               "--steps", "30", "--resume", str(bad), "--out-dir", out],
                              capture_output=True, text=True, timeout=120, env=env)
    return proc.returncode, proc.stderr


def _result(name: str, raw: dict, injected: str) -> FaultResult:
    cli_lines = [line for line in raw["cli_stderr"].splitlines() if line.strip()]
    cli_ok = raw["cli_rc"] == 2 and len(cli_lines) == 1 and "Traceback" not in raw["cli_stderr"]
    detected = raw["error_type"] == "CaramelError" and "ckpt-" in raw["error"]
    fell_back = raw["fallback_step"] == OLD_STEP
    notes = [] if cli_ok else [f"`caramel train --resume` gave exit {raw['cli_rc']} and {len(cli_lines)} stderr lines"]
    if raw["error_type"] not in ("CaramelError", ""):
        notes.append(f"load raised {raw['error_type']}, not CaramelError")
    return FaultResult(
        fault=name, category="storage", injected=injected,
        expected="CaramelError naming the checkpoint; --resume auto falls back to the previous one; CLI exit 2, one line",
        detected=detected, detect_s=raw["detect_s"], exit_codes=[raw["cli_rc"]],
        message=shorten(raw["error"]), recovered=f"yes: resumes from step {raw['fallback_step']}" if fell_back else "no",
        data_lost=f"{NEW_STEP - OLD_STEP} steps (back to the previous checkpoint)" if fell_back else "unknown",
        passed=detected and fell_back and cli_ok, notes="; ".join(notes), details=raw)


@fault("checkpoint-bit-flip", "storage")
def checkpoint_bit_flip(cfg: MatrixConfig) -> FaultResult:
    raw = checkpoint_experiment(lambda d: flip_byte(d / "state.pt"))
    return _result("checkpoint-bit-flip", raw, "one byte of the newest checkpoint's state.pt inverted")


@fault("checkpoint-truncated", "storage")
def checkpoint_truncated(cfg: MatrixConfig) -> FaultResult:
    raw = checkpoint_experiment(lambda d: truncate_half(d / "state.pt"))
    return _result("checkpoint-truncated", raw, "the newest checkpoint's state.pt cut to half its size")


@fault("checkpoint-meta-truncated", "storage")
def checkpoint_meta_truncated(cfg: MatrixConfig) -> FaultResult:
    raw = checkpoint_experiment(lambda d: truncate_half(d / "meta.json"))
    return _result("checkpoint-meta-truncated", raw, "the newest checkpoint's meta.json cut to half its size")


@fault("checkpoint-state-missing", "storage")
def checkpoint_state_missing(cfg: MatrixConfig) -> FaultResult:
    raw = checkpoint_experiment(lambda d: (d / "state.pt").unlink())
    return _result("checkpoint-state-missing", raw, "the newest checkpoint's state.pt deleted")
