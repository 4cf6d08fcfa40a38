"""What one gossip step sends to each peer, by exchange: one definition for the runtime (which
tensors travel, `run.GossipRun` and `tracking.Tracker`) and the simulator (what they
cost, `simulate.py`), so the two cannot price different bytes.

Per gossiped parameter p, to each out-neighbour of the step:

    parameters' exchange:  p itself, then (momentum, overlap_momentum, tracking_momentum) each moment buffer the
                           optimizer keeps for it (SGD: 1, Adam/AdamW: 2), in p's dtype;
                           plus every floating buffer not personalized (BatchNorm statistics)
    trackers' exchange:    (tracking, tracking_momentum) p's tracker, in tracker_dtype(p.dtype)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from caramel.errors import CaramelError

# The optimizer state the moment-mixing algorithms gossip. Adam's second moment goes with its
# first: a mixed first moment over this worker's own second moment divides a neighbour's
# momentum by a near-zero denominator wherever this worker's gradients are zero and the
# neighbour's are not (digits' border pixels: the loss reached 3e6 by step 5).
MOMENT_KEYS = {"SGD": ("momentum_buffer",), "Adam": ("exp_avg", "exp_avg_sq"), "AdamW": ("exp_avg", "exp_avg_sq")}
MIXES_MOMENTS = ("momentum", "overlap_momentum", "tracking_momentum")
TRACKS = ("tracking", "tracking_momentum")


def moment_keys(optimizer: str, algorithm: str) -> tuple[str, ...]:
    """The optimizer-state entries gossiped with each parameter under `algorithm`, for the
    torch.optim class named `optimizer`: none unless the algorithm mixes moments."""
    if algorithm not in MIXES_MOMENTS:
        return ()
    if optimizer not in MOMENT_KEYS:
        raise CaramelError(f"strategy 'gossip': algorithm={algorithm} exchanges the optimizer's momentum buffers, which "
                           f"SGD (momentum > 0), Adam and AdamW keep; got {optimizer}")
    return MOMENT_KEYS[optimizer]


def tracker_dtype(dtype: torch.dtype) -> torch.dtype:
    """A parameter's tracker dtype: its own when at least float32 wide, else float32 (a
    low-precision tracker's rounding would pile up in sum_i y_i - sum_i g_i, never corrected)."""
    return torch.promote_types(dtype, torch.float32)


@dataclass(frozen=True)
class PeerBytes:
    """Bytes one step sends to each out-neighbour: the parameters' exchange and the trackers'."""

    parameters: int
    trackers: int

    @property
    def total(self) -> int:
        return self.parameters + self.trackers


def peer_bytes(algorithm: str, optimizer: str, params: Iterable[tuple[int, torch.dtype]],
               buffer_bytes: int) -> PeerBytes:
    """What a step sends to each peer: `params` are the gossiped parameters as (numel, dtype),
    `buffer_bytes` the gossiped floating buffers' bytes, `optimizer` the torch.optim class name."""
    copies = 1 + len(moment_keys(optimizer, algorithm))
    exchange, trackers = buffer_bytes, 0
    for numel, dtype in params:
        exchange += copies * numel * dtype.itemsize
        if algorithm in TRACKS:
            trackers += numel * tracker_dtype(dtype).itemsize
    return PeerBytes(exchange, trackers)
