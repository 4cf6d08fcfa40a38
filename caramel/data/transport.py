"""How a batch crosses from a loader worker process to the training process.

PyTorch's default puts every tensor of a batch in its own shared-memory segment and passes the
segment's file descriptor over a socket: no copy of the bytes, but a fixed cost per tensor
(create, map, send, map again, unmap), which for small batches is more than copying them
(measured: docs/data.md, "Transport", and the batch trip by pipe and by shared memory in
docs/results/data-bench-store.md). So a batch of at most `pipe_max_bytes` travels as numpy
arrays through the pipe (one copy) and becomes tensors again in the training process without
another copy; a larger batch keeps shared memory.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import collate, default_collate_fn_map

PIPE_MAX_BYTES = 1 << 20


def _stack(batch, *, collate_fn_map=None) -> torch.Tensor:
    return torch.stack(batch, 0)  # in ordinary memory: default_collate would allocate shared memory in a worker


_PLAIN_MAP = {**default_collate_fn_map, torch.Tensor: _stack}


class PipedBatch:
    """A collated batch whose tensors were turned into numpy arrays to be pickled through the pipe."""

    def __init__(self, tree: Any):
        self.tree = tree


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for x in tree for t in _tensors(x)]
    if isinstance(tree, dict):
        return [t for x in tree.values() for t in _tensors(x)]
    return []


def _map(tree: Any, fn) -> Any:
    if isinstance(tree, (torch.Tensor, np.ndarray)):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(_map(x, fn) for x in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(x, fn) for x in tree)
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    return tree


def _to_numpy(t):
    try:
        return t.numpy() if isinstance(t, torch.Tensor) else t
    except TypeError:  # a dtype numpy lacks (bfloat16): it goes through shared memory after all
        return t


class WorkerCollate:
    """The collate function run in loader workers: small batches through the pipe, large ones in shared memory."""

    def __init__(self, pipe_max_bytes: int = PIPE_MAX_BYTES):
        self.pipe_max_bytes = pipe_max_bytes

    def __call__(self, samples: list[Any]) -> Any:
        if torch.utils.data.get_worker_info() is None:
            return collate(samples, collate_fn_map=default_collate_fn_map)
        batch = collate(samples, collate_fn_map=_PLAIN_MAP)
        if sum(t.numel() * t.element_size() for t in _tensors(batch)) <= self.pipe_max_bytes:
            return PipedBatch(_map(batch, _to_numpy))
        return _map(batch, lambda t: t.share_memory_() if isinstance(t, torch.Tensor) else t)


def received(batch: Any) -> Any:
    """The batch as tensors, in the training process (numpy arrays from the pipe wrapped, not copied)."""
    if isinstance(batch, PipedBatch):
        return _map(batch.tree, lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a)
    return batch
