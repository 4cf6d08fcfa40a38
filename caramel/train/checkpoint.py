"""Checkpoints: atomic, self-checking, loadable with `torch.load(weights_only=True)`.

A checkpoint is a directory `ckpt-<step>/` holding `state.pt` (model, optimizer, LR scheduler,
step, data position, every rank's RNG states, effective config) and `meta.json`
(`caramel.checkpoint/1`: step, world size, and the SHA-256 of `state.pt`). It is written into a
temporary directory next to its final place and renamed into place, so a crash leaves either
the whole checkpoint or none, and the hash catches files damaged afterwards. Every check runs
before anything is loaded into the model, so a bad checkpoint never half-loads.
"""
from __future__ import annotations

import hashlib
import io
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.jsonio import read_json, write_json

KIND = "checkpoint"
STATE_FILE = "state.pt"
META_FILE = "meta.json"
_NAME = re.compile(r"^ckpt-(\d+)$")
# Config keys that may change across a resume; everything else must match for the run to continue exactly.
RESUMABLE_CHANGES = {
    "run": {"stop_after_steps", "out_dir", "log_every_steps", "val_every_steps"},
    "parallel": {"strategy", "cluster", "bandwidth", "max_restarts", "timeout_s", "workers", "slow_worker"},
    "checkpoint": {"every_steps", "keep_last", "resume", "dir"},
    "data": {"cache_dir"},  # a new cache directory changes no batch of the resumed epoch (its order is in the checkpoint)
}


# --- RNG states as tensors and plain lists (weights_only=True accepts nothing else) -----------

def rng_state() -> dict[str, Any]:
    """This process's torch, numpy and python RNG states, encoded as tensors and lists."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": list(py_state), "gauss_next": gauss_next},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


# --- writing --------------------------------------------------------------------------------

def checkpoint_path(ckpt_dir: str | Path, step: int) -> Path:
    return Path(ckpt_dir) / f"ckpt-{step:09d}"


def save(ckpt_dir: str | Path, step: int, state: dict[str, Any], world_size: int, keep_last: int) -> Path:
    """Write `state` as checkpoint `step` atomically (temp dir, then rename) and prune to the newest `keep_last`."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(ckpt_dir, step)
    tmp = ckpt_dir / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    buf = io.BytesIO()
    torch.save(state, buf)
    blob = buf.getvalue()
    with open(tmp / STATE_FILE, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    write_json(tmp / META_FILE, {"format": f"caramel.{KIND}/1", "step": step, "world_size": world_size,
                                 "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)})
    if final.exists():  # the same step written again (a restarted worker): swap, never leave a gap
        old = ckpt_dir / f".old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(ckpt_dir)
    for _, path in list_checkpoints(ckpt_dir)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_all(ckpt_dir: str | Path) -> int:
    """Delete every checkpoint (and leftover temporary directory) in `ckpt_dir`; return how many checkpoints."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return 0
    found = list_checkpoints(ckpt_dir)
    for _, path in found:
        shutil.rmtree(path, ignore_errors=True)
    for leftover in ckpt_dir.glob(".tmp-ckpt-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return len(found)


# --- reading --------------------------------------------------------------------------------

def list_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint directory in `ckpt_dir`, oldest first (validity not checked)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return sorted(found)


def load(path: str | Path) -> dict[str, Any]:
    """Read and verify a checkpoint directory; CaramelError if it is missing, damaged or not ours."""
    path = Path(path)
    if not path.is_dir():
        raise CaramelError(f"checkpoint {path}: not a directory (expected a ckpt-<step> directory written by caramel train)")
    meta = read_json(path / META_FILE, KIND)
    state_file = path / STATE_FILE
    try:
        blob = state_file.read_bytes()
    except FileNotFoundError:
        raise CaramelError(f"checkpoint {path}: {STATE_FILE} is missing") from None
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise CaramelError(f"checkpoint {path}: {STATE_FILE} is corrupt ({len(blob)} bytes, SHA-256 does not match meta.json; "
                           f"expected {meta.get('bytes')} bytes); use an older checkpoint or start fresh with --resume none")
    try:
        state = torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as e:  # the hash matched, so this is a foreign or incompatible file
        raise CaramelError(f"checkpoint {path}: {STATE_FILE} cannot be loaded with weights_only=True ({type(e).__name__}: {e})") from None
    missing = [k for k in ("step", "epoch", "index", "model", "optimizer", "scheduler", "rng", "config") if k not in state]
    if missing or not isinstance(state.get("rng"), list):
        raise CaramelError(f"checkpoint {path}: {STATE_FILE} lacks {', '.join(missing) or 'per-rank rng states'}; not a caramel train checkpoint")
    if state["step"] != meta.get("step"):
        raise CaramelError(f"checkpoint {path}: meta.json says step {meta.get('step')} but {STATE_FILE} holds step {state['step']}")
    return state


def latest_valid(ckpt_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint in `ckpt_dir` that verifies, with its state (damaged newer ones are skipped)."""
    for _, path in reversed(list_checkpoints(ckpt_dir)):
        try:
            return path, load(path)
        except CaramelError:
            continue
    return None


def check_compatible(state: dict[str, Any], config: dict[str, Any], world_size: int, model: torch.nn.Module, source: str) -> None:
    """Refuse (CaramelError) a checkpoint whose config, world size or parameter shapes differ from this run."""
    from caramel.train.config import TrainConfig

    defaults = TrainConfig().to_dict()  # a key newer than the checkpoint had its default when it was written
    diffs = []
    for section, values in config.items():
        saved = state["config"].get(section, {})
        for key, value in values.items():
            was = saved.get(key, defaults.get(section, {}).get(key))
            if key not in RESUMABLE_CHANGES.get(section, set()) and was != value:
                diffs.append(f"{section}.{key} = {was!r} in the checkpoint, {value!r} now")
    if diffs:
        raise CaramelError(f"checkpoint {source} does not match this run: {'; '.join(diffs)}")
    if len(state["rng"]) != world_size:
        raise CaramelError(f"checkpoint {source} was written by {len(state['rng'])} workers; this run has {world_size} "
                           f"(per-worker data shards and random states cannot be mapped to a different count)")
    mine = model.state_dict()
    saved = state["model"]
    if set(mine) != set(saved):
        extra, lacking = sorted(set(saved) - set(mine)), sorted(set(mine) - set(saved))
        raise CaramelError(f"checkpoint {source}: model entries differ (only in checkpoint: {extra[:5]}; only in model: {lacking[:5]})")
    for key, tensor in mine.items():
        if not isinstance(saved[key], torch.Tensor) or saved[key].shape != tensor.shape or saved[key].dtype != tensor.dtype:
            got = tuple(saved[key].shape) if isinstance(saved[key], torch.Tensor) else type(saved[key]).__name__
            raise CaramelError(f"checkpoint {source}: model entry {key!r} is {got}, the model has {tuple(tensor.shape)} {tensor.dtype}")
