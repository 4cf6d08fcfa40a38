"""Handing the gradients to torch DDP, and taking them back.

When the overlap trial keeps DDP's schedule (or times it), torch's own
`DistributedDataParallel` runs it: its C++ reducer costs less per step than the engine's Python
hooks, so the job runs at DDP's speed. `hand_over` wraps the model once (later hand-overs reuse
it) and tells the engine to stand aside (`Engine.delegate_to`); `take_back` returns the
gradients to the engine's plan before any new plan is adopted. With balance="batch" the DDP
module reduces through `ddp_shares.SharesHook` (buckets weighted by share, waits timed on
gloo). Both happen at the same step on every rank, with nothing pending.
"""
from __future__ import annotations

import datetime
import warnings

import torch.distributed as dist
import torch.nn as nn

from caramel.runtime.comm_priority import CommPriority
from caramel.runtime.engine import Engine
from caramel.strategies.caramel.ddp_shares import SharesHook


class Handover:
    def __init__(self, engine: Engine, model: nn.Module, group, comm_priority: CommPriority,
                 broadcast_buffers: bool, find_unused_parameters: bool):
        self.engine, self.model, self.group = engine, model, group
        self.comm_priority = comm_priority
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        # balance="batch": DDP's buckets weighted by share and their waits timed (`ddp_shares`)
        self.weight_shares = False
        self.shares_hook: SharesHook | None = None

    def hand_over(self) -> None:
        """DDP's schedule was chosen: let torch DDP run it. Its constructor checks the parameters'
        shapes and broadcasts rank 0's parameters and buffers: collectives every rank makes
        here, on values already equal."""
        from torch.nn.parallel import DistributedDataParallel

        self.engine.synchronize()
        ddp, group = self.engine.ddp, None
        if ddp is None:
            # With the search for unused parameters unless the user vouches that every parameter
            # gets a gradient in every step: a parameter can go unused in any later step (a
            # data-dependent branch), which DDP without the search turns into an error at the
            # next forward, after a step on partly reduced gradients; the search walks the
            # autograd graph every step (~3% of a ResNet-18 step here). broadcast_buffers=False
            # keeps rank-local buffers rank-local, also at construction (torch's own advice while
            # it deprecates the flag), so it is passed only then.
            kwargs = {} if self.broadcast_buffers else {"broadcast_buffers": False}
            group = self._new_group()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ddp = DistributedDataParallel(self.model, process_group=group or self.group,
                                              find_unused_parameters=self.find_unused_parameters, **kwargs)
            if self.weight_shares:  # before DDP's first backward, as torch requires
                self.shares_hook = SharesHook(self.engine, ddp.process_group)
                ddp.register_comm_hook(None, self.shares_hook.reduce)
        hook = self.shares_hook
        self.engine.delegate_to(ddp, group=group, wait_s=hook.wait_s if hook is not None else None)

    def take_back(self) -> None:
        """The engine's own plan reduces the gradients again (a no-op unless handed over)."""
        self.engine.take_back()

    def _new_group(self):
        """A group of DDP's own, or None for the job's group. The trial timed DDP's schedule on the
        engine's own threads, so unless `comm_priority="normal"`, when the job's group is the
        default gloo group, DDP gets a new gloo group over it whose threads get what the
        engine's got (real-time where allowed; decided by the mode, the same on every rank, so
        that every rank makes the group); otherwise the job's group itself (a subgroup cannot be
        copied without every process of the job taking part). Released with the engine."""
        if (self.comm_priority.mode == "normal" or self.group is not dist.group.WORLD
                or dist.get_backend(self.group) != "gloo"):
            return None
        timeout = datetime.timedelta(seconds=self.engine.timeout_s)
        return self.comm_priority.start(lambda: dist.new_group(backend="gloo", timeout=timeout))
