"""Run the `ps` strategy: `parallelize_ps` wraps the model and the user's optimizer around a
`PsRun` (`caramel.strategies.ps.run`), which drives a `PsEngine` and plans it.

Without a `profile=`, the first two steps profile the model online (step 0 records which module
first uses each parameter, step 1 times the modules and gradients, both with every pull
finished before the forward, which also times the pulls alone); rank 0 then makes the plan
(`caramel.strategies.ps.planner`), every rank receives it, and optimizer state moves to the
new placement. From then on pulls overlap the forward and every step logs TicTac's E and S and
its staleness (`stats_dict()`, and the trace when `trace=PATH`).
"""
from __future__ import annotations

import contextlib
import datetime
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import init_distributed, resolve_timeout_s
from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.profile.profiler import unique_params
from caramel.runtime.buffer_sync import buffer_mode
from caramel.runtime.optimizer import PER_PARAMETER_OPTIMIZERS, rebind_class, steps_per_parameter
from caramel.strategies.ps.transfers import PsGroups
from caramel.strategies.ps.hierarchy import local_world_size, make_hierarchy
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.resume import STATE_KEY as PS_STATE_KEY, restore, run_state
from caramel.strategies.ps.planner import first_plan
from caramel.strategies.ps.run import PROFILE_STEPS, PsRun
from caramel.strategies.ps.server import dedicated_servers, make_groups, serve_and_leave
from caramel.strategies.options import check_same_everywhere

__all__ = ["PROFILE_STEPS", "PsModel", "PsOptimizerMixin", "PsRun", "parallelize_ps"]


class PsModel(nn.Module):
    """The user's module behind a DDP-shaped wrapper (`.module`, `no_sync()`)."""

    def __init__(self, module: nn.Module, run: PsRun):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_run", run)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._run.before_forward()
        try:
            return self.module(*args, **kwargs)
        finally:
            self._run.after_forward()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; nothing is pushed."""
        e = self._run.engine
        e.require_sync = False
        try:
            yield
        finally:
            self._run.engine.require_sync = True

    def synchronize(self) -> None:
        self._run.synchronize()


class PsOptimizerMixin:
    """Mixed in front of the user's optimizer class: `step()` pushes and lets the servers apply."""

    _ps_run: PsRun
    _ps_base: type

    def step(self, closure=None):  # noqa: D401 - same contract as torch.optim.Optimizer.step
        if closure is not None:
            raise CaramelError("strategy 'ps': optimizer.step(closure) is not supported (the servers apply the update)")
        self._opt_called = True  # tells LR schedulers a step happened
        self._ps_run.step()
        return None

    def _caramel_inner_step(self) -> None:
        self._ps_base.step(self)

    def synchronize(self) -> None:
        """All ranks: every update applied and pulled, the servers' state gathered for state_dict()."""
        self._ps_run.synchronize()

    def state_dict(self):
        if not self._ps_run.full_state_ready():
            raise CaramelError("strategy 'ps': optimizer.state_dict() holds every server's state only right after "
                               "optimizer.synchronize() on every rank; call that first")
        state = self._ps_base.state_dict(self)
        state[PS_STATE_KEY] = run_state(self._ps_run)  # plan, step count, staleness (`resume.py`)
        return state

    def load_state_dict(self, state_dict):
        self._ps_run.engine.synchronize()
        state_dict = dict(state_dict)
        entry = state_dict.pop(PS_STATE_KEY, None)
        out = self._ps_base.load_state_dict(self, state_dict)
        if entry is not None:  # before after_load: each rank keeps the state of the plan it adopts
            restore(self._ps_run, entry)
        self._ps_run.after_load(state_dict)
        return out

    @property
    def ps(self) -> PsRun:
        return self._ps_run


def _wrap_optimizer(optimizer: torch.optim.Optimizer, run: PsRun) -> torch.optim.Optimizer:
    base = type(optimizer)
    cls = type(f"Ps{base.__name__}", (PsOptimizerMixin, base), {"_ps_base": base})
    return rebind_class(optimizer, cls, _ps_run=run)


def _group_timeout(parent: Any, timeout_s: float | None) -> datetime.timedelta:
    """The private groups' collective timeout: `timeout_s`, else the parent group's own (so a
    dead peer is detected as soon as the job's other collectives would detect it)."""
    if timeout_s is None:
        pg = parent or dist.group.WORLD
        try:
            return pg._get_backend(torch.device("cpu")).options._timeout
        except Exception:  # noqa: BLE001 - not a gloo group, or a torch without these internals
            pass
    return datetime.timedelta(seconds=resolve_timeout_s(timeout_s))


def parallelize_ps(model: nn.Module, optimizer: torch.optim.Optimizer, options: PsOptions, *,
                   process_group: Any = None, broadcast_buffers: bool | str = True,
                   find_unused_parameters: bool | None = None, timeout_s: float | None = None,
                   plan: Any = None, profile: ModelProfile | None = None, cluster: Any = None,
                   trace: str | None = None, session: Any = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """`caramel.parallelize(model, optimizer, "ps", ...)`; see the module docstring."""
    if plan is not None:
        raise CaramelError("strategy 'ps' takes no plan= (it plans its own pushes and pulls from the profile)")
    buffer_mode(broadcast_buffers)  # True/"early", "forward" or False, before anything starts
    if isinstance(optimizer, PsOptimizerMixin):
        raise CaramelError("strategy 'ps': this optimizer is already parallelized")
    if not steps_per_parameter(optimizer):
        raise CaramelError(f"strategy 'ps': each server applies the optimizer to its own shard, which is exact only for "
                           f"optimizers that update each parameter from its own gradient and state "
                           f"({', '.join(PER_PARAMETER_OPTIMIZERS)}); got {type(optimizer).__name__}")
    _, params = unique_params(model)
    known = {id(p) for p in params}
    if any(id(p) not in known for g in optimizer.param_groups for p in g["params"]):
        raise CaramelError("strategy 'ps': the optimizer holds parameters that are not the model's; "
                           "make the optimizer from this model's parameters()")
    if session is not None and any(isinstance(r, PsRun) and r.groups.dedicated and not r.released
                                   for r in session.live_engines()):
        raise CaramelError("strategy 'ps': dedicated servers serve one model at a time; call caramel.shutdown() "
                           "(the servers then leave) before parallelizing another model")
    if not dist.is_initialized():
        init_distributed(timeout_s=timeout_s)
    ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
    # on the parent, before any group of ours exists
    check_same_everywhere("ps", options, [tuple(p.shape) for p in params], process_group, "parameter shapes")
    timeout = _group_timeout(process_group, timeout_s)
    local = local_world_size(len(ranks)) if options.hierarchical else 1
    dedicated = dedicated_servers(options, len(ranks))
    shards = options.check_world(len(ranks), local, dedicated)
    clip = options.clip_grad_norm > 0
    if dedicated:
        groups = make_groups(ranks, dedicated, timeout, clip)
    else:
        flat = not options.hierarchical
        groups = PsGroups(*(dist.new_group(ranks, timeout=timeout) for _ in range(2)),
                          push=[dist.new_group(ranks, timeout=timeout) for _ in range(shards)] if flat else [],
                          pull=[dist.new_group(ranks, timeout=timeout) for _ in range(shards)] if flat else [])
    if clip and not dedicated:  # colocated: every rank calls it (a rank serving nothing adds 0)
        groups.clip = dist.new_group(ranks, timeout=timeout)
    if options.hierarchical:
        groups.hier = make_hierarchy(ranks, ranks.index(dist.get_rank()), local, shards, timeout)
    with torch.no_grad():  # every worker starts from rank 0's model, as DDP does
        for t in list(params) + list(model.buffers()):
            dist.broadcast(t, src=ranks[0], group=groups.control)
    if dist.get_rank(groups.control) in groups.dedicated:
        serve_and_leave(model, optimizer, first_plan(params, shards, options), groups, ranks, options.clip_grad_norm)
    run = PsRun(model, optimizer, options, ranks, groups, broadcast_buffers, profile, cluster,
                str(trace) if trace else None)
    if session is not None:
        session.register(run)
    return PsModel(model, run), _wrap_optimizer(optimizer, run)

