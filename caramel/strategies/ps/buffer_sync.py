"""bsp: rank 0's buffers (BatchNorm statistics) by the runtime's `BufferSync`, sent at step().

DDP broadcasts rank 0's buffers as a forward starts (when the forward before was a synchronized
training one). Under ps that small broadcast leaves rank 0 just after rank 0's own pulls were
handed to the link, so it waits in the queue behind them, and the forward cannot start before it
lands: on ResNet-18/16 at 335 Mbit/s every forward began only once most pulls were through,
whatever their order. Sent as step() hands over the pulls, before them, it is never behind them.

The runtime's `BufferSync` (caramel/runtime/buffer_sync.py) does the rest as for the caramel
strategy: DDP's rule for which forwards sync (`no_sync` and no-grad forwards included), and at
the next forward each rank compares its buffers with what they held when the early broadcast left;
buffers changed since (reset_running_stats, a model-only load_state_dict, extra train-mode
forwards) take DDP's path, a broadcast at that forward. Flat colocated bsp sends early; dedicated
servers, hierarchical runs and `broadcast_buffers="forward"` broadcast at the forward only.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.runtime.buffer_sync import BufferSync, buffer_mode
from caramel.trace.recorder import Recorder


class _PsHost:
    """What `BufferSync` asks of its engine, answered by the ps run (whose engine a re-plan replaces)."""

    delegating = False

    def __init__(self, run: Any, rank: int, world: int):
        self.run = run
        self.recorder = Recorder(rank, world, enabled=False)

    @property
    def require_sync(self) -> bool:
        return self.run.engine.require_sync

    def count_wait(self, _seconds: float) -> None:
        """ps times its forwards after the buffers have landed: nothing to take out."""


def ps_buffer_sync(run: Any, module: nn.Module, broadcast_buffers: Any, group: Any, early: bool) -> BufferSync | None:
    """The run's buffer sync, or None (no buffers, one worker, rank-local buffers, or ssp/asp,
    which send rank 0's buffers at synchronize() only). `early`: flat colocated bsp."""
    mode = buffer_mode(broadcast_buffers)
    if mode is None or run.engine.bound != 0 or run.engine.workers < 2 or not any(True for _ in module.buffers()):
        return None
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = next(module.parameters()).device
    return BufferSync(module, _PsHost(run, dist.get_rank(group), dist.get_world_size(group)), group,
                      mode=mode if early else "forward", device=device, send_at="call")
