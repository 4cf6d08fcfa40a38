"""The rate within an emulated host, for jobs with several ranks per host (`--nproc-per-node`).

Ranks of one host share its network namespace: they talk over the kernel's loopback, unshaped
and bounded by the host's CPUs, not by the host's link. The ps simulator prices a hierarchical
push's node stage at `meta["node_bandwidth_bps"]` (else the link's rate, far too slow here), so
the bench measures it: each host's first rank ping-pongs a gradient-sized tensor with each other
rank of its host (all hosts at once), and the rate is one copy's bytes over half the median
round trip. Run after the measured rounds, alone: it perturbs nothing measured, and sees no
compute or link traffic beside it, as the node stages do in a step (how much the model's error
depends on this rate: docs/ps.md).
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from caramel.stats import median

NODE_PROBE_REPS = 5  # timed round trips per pair, after one untimed


def probe_node_rate(nbytes: int, local: int, reps: int = NODE_PROBE_REPS,
                    device: torch.device | None = None) -> dict[str, Any] | None:
    """Every rank calls it; `local` consecutive ranks share a host. Returns, on every rank,
    {"bytes", "reps", "copy_s" (per host, its pairs' median one-way time), "node_bandwidth_bps"
    (bytes over the median of those)}; None with one rank per host. `device`: where the job's
    tensors live (a CUDA tensor on NCCL; the clock waits for its copies)."""
    if local < 2:
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    leader, me = rank - rank % local, rank % local
    buf = torch.zeros(max(int(nbytes) // 4, 1), dtype=torch.float32, device=device)
    wait = (lambda: torch.cuda.synchronize(buf.device)) if buf.is_cuda else (lambda: None)
    one_way: list[float] = []
    for peer in range(1, local):
        dist.barrier()
        for rep in range(reps + 1):
            if me == 0:
                t0 = time.perf_counter()
                dist.send(buf, leader + peer)
                dist.recv(buf, leader + peer)
                wait()  # NCCL's recv returns once queued on the stream
                if rep:  # the first round trip sets the pair's connection up
                    one_way.append((time.perf_counter() - t0) / 2)
            elif me == peer:
                dist.recv(buf, leader)
                dist.send(buf, leader)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, median(one_way) if one_way else None)
    copy_s = [s for s in gathered if s is not None]
    nb = buf.numel() * 4
    return {"bytes": nb, "reps": reps, "copy_s": copy_s, "node_bandwidth_bps": nb * 8 / median(copy_s)}
