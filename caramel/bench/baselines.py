"""The two baselines every configuration needs, and the runner interface strategies share.

- compute-only: the same model, batch and optimizer, with no communication at all, the workers
  running side by side (so they contend for the host's cores exactly as in the real run).
- comm-only: the same gradient bytes all-reduced with nothing else running, bucketed the way
  DDP buckets them (reverse registration order, a 1 MiB first bucket, then 25 MiB caps, a
  bucket closing once it reaches its cap), all buckets issued asynchronously then awaited.

- concurrent: both at once and independent of each other: the comm-only buckets issued at the
  top of each compute-only step and awaited at its end. No schedule can start communication
  earlier or hide more of it, so this is the step of a perfect overlap on this host, contention
  for the cores and the network stack included (T_concurrent; on an ideal host it equals L).

Together they give T_compute and T_comm, hence U = T_compute + T_comm and L = max(...), and
T_concurrent, what overlapping everything really costs here.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.bench.contention import span_padding

MiB = 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1 * MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_CAP_MB = 25.0


class Runner:
    """One strategy or baseline inside the harness: `step()` is timed, `finish()` is not.

    `finish()` drains whatever communication a step left pending, so the next strategy in the
    round starts on an idle network and nobody is charged for another's traffic.
    """

    name: str = "?"
    entry_steps: int = 1
    """unmeasured steps before a timed block: one more than the updates a step may leave
    outstanding (`caramel.bench.blocks`), so the untimed drain equals the backlog owed in"""
    drain_timed: bool = False
    """no bound on the outstanding updates: the block times its drain (`caramel.bench.blocks`)"""

    def step(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def settled(self) -> bool:
        """False while the strategy is still choosing its schedule (profiling, trials): warm-up goes on."""
        return True

    def start_measuring(self) -> None:
        """Warm-up is over: forget what the warm-up steps recorded."""

    def close(self) -> None:
        """Free now what gc would free late or never: a process group made for this runner alone
        (its threads and connections), and the runner's hold on its model. Called on every rank
        in the same order; the runner is not stepped again."""


def trainable_params(model: nn.Module) -> list[nn.Parameter]:
    """Parameters that get gradients, each once (tied parameters count once), in registration order."""
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def ddp_bucket_bytes(param_bytes: list[int], bucket_cap_mb: float = DDP_BUCKET_CAP_MB,
                     first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """Bucket sizes DDP would use for parameters of these sizes (given in registration order).

    DDP walks parameters in reverse registration order (the order gradients become ready) and
    closes a bucket once it holds at least the current limit: 1 MiB for the first bucket,
    `bucket_cap_mb` MiB after that. Tensors are never split.
    """
    assert all(b > 0 for b in param_bytes), "parameter sizes must be positive"
    cap = int(bucket_cap_mb * MiB)
    limits = [first_bucket_bytes, cap]
    buckets: list[int] = []
    current = 0
    for nbytes in reversed(param_bytes):
        current += nbytes
        if current >= limits[min(len(buckets), 1)]:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    return buckets


def sync_device(device: torch.device) -> None:
    """Make a timestamp mean what the user sees: on GPU, wait for queued kernels."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
               targets: torch.Tensor, loss_fn: Callable) -> None:
    """One training step exactly as a user writes it (DDP and Caramel use the same one)."""
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class ComputeOnly(Runner):
    """The user's step on an unwrapped model: no communication, T_compute."""

    name = "compute"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs, targets, loss_fn, device: torch.device):
        self.model, self.optimizer = model, optimizer
        self.inputs, self.targets, self.loss_fn = inputs, targets, loss_fn
        self.device = device
        self.jitter: Any = None  # --jitter: the model's JitterSchedule (`caramel.bench.hetero`)
        self.paused_s: list[float] = []
        """per own step since `start_measuring` (not the concurrent baseline's), the jitter's
        sleep in it: the unpadded compute is each measured step less its own pause"""

    def start_measuring(self) -> None:
        self.paused_s.clear()

    def run(self) -> None:
        """One plain step, unrecorded (the concurrent baseline's compute)."""
        plain_step(self.model, self.optimizer, self.inputs, self.targets, self.loss_fn)
        sync_device(self.device)

    def step(self) -> None:
        slept = len(self.jitter.slept_s) if self.jitter is not None else 0
        self.run()
        if self.jitter is not None:
            self.paused_s.append(sum(self.jitter.slept_s[slept:]))


class CommOnly(Runner):
    """All-reduce the model's gradient bytes in DDP's buckets, nothing else running: T_comm."""

    name = "comm"

    def __init__(self, model: nn.Module, device: torch.device, process_group=None,
                 bucket_cap_mb: float = DDP_BUCKET_CAP_MB, priority: Any = None):
        params = trainable_params(model)
        dtypes = {p.dtype for p in params}
        # DDP buckets per dtype; the zoo models are single-dtype, and mixing would change the bytes.
        assert len(dtypes) == 1, f"comm-only baseline expects one gradient dtype, got {dtypes}"
        self.dtype = dtypes.pop()
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        sizes = ddp_bucket_bytes([p.numel() * itemsize for p in params], bucket_cap_mb)
        self.buffers = [torch.ones(n // itemsize, dtype=self.dtype, device=device) for n in sizes]
        self.bucket_bytes = sizes
        self.device = device
        self.group = process_group
        self.priority = priority  # the CommPriority of the group's threads; None: the job's group

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_bytes)

    def issue(self) -> list:
        """Every bucket's all-reduce, handed to the backend; the works to wait for."""
        return [dist.all_reduce(b, group=self.group, async_op=True) for b in self.buffers]

    def step(self) -> None:
        for w in self.issue():
            w.wait()
        sync_device(self.device)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"buckets": len(self.buffers), "bytes_per_step": self.total_bytes}
        if self.priority is not None:
            out["comm_priority"] = self.priority.to_dict()
        return out


class Concurrent(Runner):
    """All of a step's communication beside all of its computation, no dependency between them:
    the perfect overlap, as fast as this host runs it (T_concurrent)."""

    name = "concurrent"

    def __init__(self, compute: ComputeOnly, comm: CommOnly):
        self.compute, self.comm = compute, comm
        # per step on CPU: (the compute's duration, how long a collective was in flight during
        # it, seconds; how many collectives started during it), for caramel.bench.contention; a
        # GPU's compute and transfers do not share the host's cores that way
        self.spans: list[tuple[float, float, int]] = []
        # per span under --jitter: the padding's share of it (`caramel.bench.contention.span_padding`)
        self.padding: list[tuple[float, float, int]] = []

    def start_measuring(self) -> None:
        self.spans.clear()
        self.padding.clear()

    def step(self) -> None:
        if self.comm.device.type != "cpu":
            # Issued first, awaited last: the whole step's compute is available to hide it.
            works = self.comm.issue()
            self.compute.run()
            for w in works:
                w.wait()
            sync_device(self.comm.device)
            return
        ends: list[float] = []
        jitter = self.compute.jitter
        slept = len(jitter.slept_at_s) if jitter is not None else 0
        t0 = time.perf_counter()
        done = [w.get_future().then(lambda _, ends=ends: ends.append(time.perf_counter())) for w in self.comm.issue()]
        self.compute.run()
        t1 = time.perf_counter()
        torch.futures.wait_all(done)
        # the backend runs a group's collectives one at a time: each starts as the one before ends
        starts = [t0] + sorted(ends)[:-1]
        overlap_end = min(max(ends, default=t0), t1)
        self.spans.append((t1 - t0, overlap_end - t0, sum(t < t1 for t in starts)))
        if jitter is not None:
            self.padding.append(span_padding(t0, t1, overlap_end, starts, jitter.slept_at_s[slept:]))
