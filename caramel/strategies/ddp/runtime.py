"""Run the `ddp` strategy: wrap the model in torch's DistributedDataParallel.

The optimizer is returned unchanged, with a `synchronize()` that does nothing (DDP applies every
update at `step()`), so a loop written for any strategy runs on this one. `session` is accepted
and unused: torch owns DDP's groups.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import init_distributed
from caramel.errors import CaramelError
from caramel.runtime.comm_priority import CommPriority
from caramel.strategies.ddp.options import DdpOptions


def parallelize_ddp(model: nn.Module, optimizer: torch.optim.Optimizer, options: DdpOptions, *,
                    process_group: Any = None, broadcast_buffers: bool | str = True,
                    find_unused_parameters: bool | None = None, timeout_s: float | None = None,
                    session: Any = None, **unsupported: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    given = sorted(k for k, v in unsupported.items() if v is not None)
    if given:
        raise CaramelError(f"strategy 'ddp' takes no {', '.join(given)} (those are the caramel strategy's)")
    if broadcast_buffers not in (True, False):
        raise CaramelError(f"strategy 'ddp': broadcast_buffers must be True or False, got {broadcast_buffers!r}")
    if not dist.is_initialized():
        init_distributed(timeout_s=timeout_s)
    device = _device_of(model)
    group, prio = ddp_group(options.comm_priority, process_group, device)
    # True is DDP's default; torch warns when it is passed at all (it renames the flag)
    kwargs: dict[str, Any] = {} if broadcast_buffers else {"broadcast_buffers": False}
    if options.bucket_cap_mb is not None:  # passing torch's default explicitly would drop its 1 MB first bucket
        kwargs["bucket_cap_mb"] = options.bucket_cap_mb
    if device.type == "cuda":
        kwargs.update(device_ids=[device.index], output_device=device.index)
    wrapped = nn.parallel.DistributedDataParallel(
        model, process_group=group,
        find_unused_parameters=bool(find_unused_parameters), gradient_as_bucket_view=options.gradient_as_bucket_view,
        static_graph=options.static_graph, **kwargs)
    wrapped.comm_priority = prio  # what the threads got (None: the job's own group)
    if not hasattr(optimizer, "synchronize"):
        optimizer.synchronize = _nothing_pending
    return wrapped, optimizer


def ddp_group(mode: str, process_group: Any, device: torch.device) -> tuple[Any, CommPriority | None]:
    """The group DDP runs on: the job's own for "normal"; else a gloo group over the same ranks
    whose threads get `mode`'s priority (`caramel.runtime.comm_priority`). Every rank makes the
    group, whatever its own privilege; "realtime" where a rank may not raise it is an error."""
    world = dist.get_world_size(process_group)
    if mode == "normal" or world == 1:
        return process_group, None
    if device.type != "cpu":
        raise CaramelError(f"strategy 'ddp': comm_priority={mode} applies to gloo's threads (CPU tensors); "
                           f"this model is on {device}")
    prio = CommPriority.resolve(mode)
    ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
    group = prio.start(lambda: dist.new_group(ranks, backend="gloo"))
    if mode == "realtime" and prio.reason is not None:
        raise CaramelError(f"strategy 'ddp': comm_priority=realtime: {prio.reason}")
    return group, prio


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _nothing_pending() -> None:
    """DDP applies every update at `step()`: nothing is ever pending."""
