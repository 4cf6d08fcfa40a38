"""`torch.profiler` set up so HolisticTraceAnalysis reads its output as it is.

HTA (facebookresearch/HolisticTraceAnalysis) analyses Kineto traces of GPU runs: it needs one
trace file per rank, each carrying `distributedInfo.rank`, and uses the `ProfilerStep#N` spans to
cut iterations; it counts NCCL kernels as communication. `torch.profiler` writes all of that when
a process group is initialized; for a single process without one, `distributedInfo` is preset here
so HTA still accepts the file. Nothing is post-processed: the files are Kineto's own.

On CPU (gloo) runs HTA finds no GPU kernels to analyse; there Caramel's own tracer is the source
(`caramel.parallelize(..., trace=...)` and `caramel trace summary`). The profiler still works on
CPU, which is how the tests check the file layout.

Usage (the schedule records steps `wait+1 .. wait+warmup+active`; call `prof.step()` once per step):

    with caramel_profiler(ProfilerConfig("prof/")) as prof:
        for x, y in loader:
            ...; optimizer.step(); prof.step()
    # then: from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir="prof/")
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from caramel.errors import CaramelError


@dataclass
class ProfilerConfig:
    """Where traces go and which steps are recorded (torch.profiler.schedule's knobs)."""

    trace_dir: str
    wait_steps: int = 1
    warmup_steps: int = 1
    active_steps: int = 3
    repeat: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    use_gzip: bool = False
    cuda: bool | None = None
    """Profile CUDA kernels; None means when CUDA is available."""

    def __post_init__(self) -> None:
        for name in ("wait_steps", "warmup_steps", "repeat"):
            if getattr(self, name) < 0:
                raise CaramelError(f"profiler {name} must be >= 0, got {getattr(self, name)}")
        if self.active_steps < 1:
            raise CaramelError(f"profiler active_steps must be >= 1, got {self.active_steps}")


def comm_annotation(bucket: int, chunk: int = 0, op: str = "allreduce") -> str:
    """The record_function name for one collective, e.g. `caramel/b3c0/allreduce` (runtime and HTA queries agree on it)."""
    return f"caramel/b{bucket}c{chunk}/{op}"


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int, bool]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return (rank if rank is not None else int(os.environ.get("RANK", 0)),
            world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", 1)), False)


def caramel_profiler(config: ProfilerConfig, rank: int | None = None, world_size: int | None = None):
    """A `torch.profiler.profile` writing one HTA-readable trace per rank into `config.trace_dir`.

    Rank and world size come from the initialized process group, else from the arguments, else
    from torchrun's RANK / WORLD_SIZE, else 0 and 1. Files are named `rank{r}.<time>.pt.trace.json`.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    r, n, has_group = _rank_and_world(rank, world_size)
    use_cuda = torch.cuda.is_available() if config.cuda is None else config.cuda
    if use_cuda and not torch.cuda.is_available():
        raise CaramelError("profiler: cuda=True but CUDA is not available on this machine")
    try:
        os.makedirs(config.trace_dir, exist_ok=True)
    except OSError as e:
        raise CaramelError(f"profiler trace_dir {config.trace_dir!r} cannot be created ({e.strerror})") from None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    prof = profile(
        activities=activities,
        schedule=schedule(wait=config.wait_steps, warmup=config.warmup_steps, active=config.active_steps,
                          repeat=config.repeat),
        on_trace_ready=tensorboard_trace_handler(config.trace_dir, worker_name=f"rank{r}", use_gzip=config.use_gzip),
        record_shapes=config.record_shapes,
        profile_memory=config.profile_memory,
        with_stack=config.with_stack,
    )
    if not has_group:
        # torch adds distributedInfo itself only with an initialized group; HTA refuses files without it
        prof.preset_metadata_json("distributedInfo", json.dumps({"backend": "none", "rank": r, "world_size": n}))
    return prof
