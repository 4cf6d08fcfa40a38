"""The one place where the training loop meets the strategy: `caramel.parallelize` with the
configured `NAME[:key=value,...]` (`caramel`, `ddp`, ...), and the process group it runs on.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import caramel
from caramel.train.config import TrainConfig


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def init_distributed(timeout_s: float) -> Dist:
    """Join (or create) the default process group from torchrun's environment; 1 process without it."""
    _init_per_attempt_group(timeout_s)
    if hasattr(caramel, "init_distributed"):
        info = caramel.init_distributed(timeout_s=timeout_s)
        return Dist(info.rank, info.world_size, info.local_rank, torch.device(info.device))
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # one process: a private group over a file store
            import tempfile
            store = dist.FileStore(tempfile.mktemp(prefix="caramel-train-store-"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=timeout_s))
        else:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device)


def _init_per_attempt_group(timeout_s: float) -> None:
    """Under torchrun's agent store, rendezvous under a per-restart key prefix.

    torchrun keeps one store across restarts; keys that a crashed attempt left there (our
    engine's private gloo groups add their own) would make the restarted workers read dead
    peers' addresses ("Connection refused" in connectFullMesh). A prefix per attempt keeps every
    attempt's keys apart, for the default group and everything built on its store.
    """
    if dist.is_initialized() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "RANK" not in os.environ:
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, store=dist.PrefixStore(f"caramel-train/attempt{attempt}/", store),
                            rank=int(os.environ["RANK"]), world_size=world, timeout=timeout)


class Parallel:
    """The wrapped model and optimizer plus the few strategy-specific calls the loop needs."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, trace_path: str | None):
        from caramel.strategies import STRATEGIES

        spec = STRATEGIES.spec(cfg.parallel.strategy)
        self.kind, self.strategy = spec.info.name, spec.name
        extra: dict[str, Any] = {}
        if self.kind == "caramel":
            extra["trace"] = trace_path
            if cfg.parallel.bandwidth and cfg.parallel.cluster != "off":
                # plan for the link the emulated cluster shapes, not the default assumption
                from caramel.topology.spec import ClusterSpec
                from caramel.units import parse_rate_bps
                extra["cluster"] = ClusterSpec.uniform(dist.get_world_size(), parse_rate_bps(cfg.parallel.bandwidth))
        self.model, self.optimizer = caramel.parallelize(model, optimizer, options=spec.options, strategy=self.kind,
                                                         **extra)

    @property
    def module(self) -> nn.Module:
        """The user's model, unwrapped (for evaluation and checkpoints, after `synchronize`)."""
        return self.model.module

    def synchronize(self) -> None:
        """Apply every pending update (Caramel may defer them; DDP has none)."""
        self.optimizer.synchronize()

    def clip_grad_norm_(self, max_norm: float) -> None:
        """Clip the global gradient norm; Caramel must first finish every reduction (it synchronizes)."""
        if self.kind == "caramel":
            caramel.clip_grad_norm_(self.optimizer, max_norm)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def stats(self) -> dict[str, Any]:
        """The engine's per-step statistics (exposed communication etc.); empty for DDP."""
        engine = getattr(self.optimizer, "engine", None)
        return dict(engine.stats_dict()) if engine is not None else {}


def model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
