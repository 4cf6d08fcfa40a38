"""Run the `ps` strategy: `parallelize_ps` wraps the model and the user's optimizer around a
`PsEngine` (`caramel.strategies.ps.engine`) and plans it.

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
import statistics
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import group_alive, init_distributed, resolve_timeout_s
from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.profile.profiler import StepTimer, UseTracker, build_profile, unique_params
from caramel.runtime.buffer_sync import buffer_mode
from caramel.runtime.optimizer import PER_PARAMETER_OPTIMIZERS, rebind_class, steps_per_parameter
from caramel.strategies.ps.buffer_sync import ps_buffer_sync
from caramel.strategies.ps.compensate import gather_mean_sq
from caramel.strategies.ps.engine import CMD_DONE, CMD_GATHER, CMD_PLAN, PsEngine
from caramel.strategies.ps.transfers import PsGroups
from caramel.strategies.ps.hierarchy import local_world_size, make_hierarchy
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.resume import STATE_KEY as PS_STATE_KEY, restore, run_state
from caramel.strategies.ps.planner import DEFAULT_LATENCY_S, PsPlan, first_plan, kind_of, make_ps_plan
from caramel.strategies.ps.server import command, dedicated_servers, make_groups, send_load, send_values, serve_and_leave
from caramel.strategies.ps.state import gather_full_state, keep_own_state, move_state
from caramel.strategies.options import check_same_everywhere
from caramel.strategies.ps.tictac import efficiency
from caramel.trace.events import Trace, TraceEvent

PROFILE_STEPS = 2


class PsRun:
    """One model under the ps strategy: its engine, its online profile, its per-step log."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, options: PsOptions, ranks: list[int],
                 groups: PsGroups, broadcast_buffers: bool | str, profile: ModelProfile | None, cluster: Any,
                 trace: str | None):
        self.module, self.optimizer, self.options, self.ranks = module, optimizer, options, ranks
        self.groups = groups
        self.cluster, self.trace_path = cluster, trace
        self.rank = dist.get_rank(groups.control)
        self.shards = options.check_world(len(ranks), groups.hier.local_size if groups.hier else 1, len(groups.dedicated))
        _, self.params = unique_params(module)
        plan = first_plan(self.params, self.shards, options)
        self.share_buffers = buffer_mode(broadcast_buffers) is not None
        self.engine = PsEngine(module, optimizer, options, plan, groups, ranks, share_buffers=self.share_buffers)
        self.buffer_sync = ps_buffer_sync(self, module, broadcast_buffers, groups.buffers,
                                          early=groups.hier is None and not groups.dedicated)
        self.engine.buffer_sync = self.buffer_sync
        self.profiling = 0 if profile is not None else PROFILE_STEPS
        self.tracker: UseTracker | None = None
        self.timer: StepTimer | None = None
        self.pull_comm_s: float | None = None
        self.unused: list[int] = []
        self.log: list[dict[str, Any]] = []
        self.released = False
        self.dc_mean_sq: dict[int, torch.Tensor] = {}  # compensate: every server's running mean squares at synchronize()
        self._fwd_t0 = self._wait0 = self._step_end = 0.0
        self.t0 = time.perf_counter()
        if profile is not None:
            self._adopt_plan(profile)

    # --- the user's loop ----------------------------------------------------------------
    def before_forward(self) -> None:
        if self.released:
            raise CaramelError("strategy 'ps': this model was shut down (caramel.shutdown()); parallelize it again")
        e, sync = self.engine, self.buffer_sync
        if sync is not None:
            sync.pre_forward(None, None)  # before the forward's clock starts, as DDP's broadcast
        try:
            self._before_forward(e)
        except BaseException:
            if sync is not None:  # the forward will not run: unwind what pre_forward began
                sync.post_forward(None, None, None)
            raise

    def _before_forward(self, e: PsEngine) -> None:
        if self.profiling == PROFILE_STEPS and torch.is_grad_enabled():
            self.tracker = UseTracker(self.module, self.params).__enter__()
        elif self.profiling and torch.is_grad_enabled() and self.tracker is not None and self.timer is None:
            self.timer = StepTimer(self.module, self.tracker.module_order)
            self.timer.forward_start()
            e.ready_callback = self.timer.grad_ready
        if self.profiling:
            e.catch_up(e.plan.params, required=e.steps)
        if e.stale is not None and not self.profiling and torch.is_grad_enabled():
            e.stale.pace()  # before the forward's clock starts: waiting for a straggler is not a pull wait
        self._fwd_t0, self._wait0 = time.perf_counter(), e.wait_s
        e.catch_up(e.waits_for.get("", []), forward=torch.is_grad_enabled())

    def after_forward(self) -> None:
        now = time.perf_counter()
        if self.buffer_sync is not None:
            self.buffer_sync.post_forward(None, None, None)
        if self.tracker is not None and self.tracker._mode is not None and self.profiling == PROFILE_STEPS:
            self.tracker.__exit__(None, None, None)
            self.tracker._mode = None
        if self.timer is not None and self.timer.cur is not None:
            self.timer.backward_start()
        if self.profiling or not torch.is_grad_enabled():
            return
        e = self.engine
        forward_s, wait_s = now - self._fwd_t0, e.wait_s - self._wait0
        entry = {"step": e.steps, "start_s": self._fwd_t0 - self.t0, "forward_s": forward_s, "wait_s": wait_s,
                 "staleness": e.staleness()}
        comm = self.pull_comm_s if self.pull_comm_s is not None else e.plan.predicted.get("comm_s")
        if comm is not None and self._step_end >= e.last_issue_t > 0:
            # TicTac's makespan of the pulls + forward: from the first pull handed to the backend
            # to the forward's end; the worker computes all of it but the waits (the time between
            # step() and forward, e.g. loading the batch, overlaps the pulls as the forward does)
            makespan = now - e.last_issue_t
            entry["E"], entry["S"] = efficiency(makespan - wait_s, comm, makespan)
        self.log.append(entry)

    def step(self) -> bool:
        e = self.engine
        if self.timer is not None and self.timer.cur is not None:
            self.timer.backward_end()
        e.catch_up(self.unused)
        e.finish_pushes()
        if self.profiling:
            e.apply_due(force_all=True)
            e.catch_up(e.plan.params, required=e.steps)
            alone = time.perf_counter() - e.last_issue_t  # every pull, nothing else running
            self.pull_comm_s = alone if self.pull_comm_s is None else min(self.pull_comm_s, alone)
            if self.timer is not None and self.timer.cur is not None:
                self.timer.step_end(0.0)
            self.profiling -= 1
            if not self.profiling:
                self._plan_online()
        else:
            e.apply_due()
        if self.engine.stale is not None:  # the engine the online plan may just have replaced
            self.engine.stale.step_done()
        self._step_end = time.perf_counter()
        return True

    # --- planning -------------------------------------------------------------------------
    def _plan_online(self) -> None:
        e = self.engine
        e.ready_callback = None
        profile = None
        if self.rank == 0:
            profile = build_profile(type(self.module).__name__, 0, self.module, self.tracker, self.timer.samples)
        self.timer.remove()
        self.tracker = self.timer = None
        self._adopt_plan(profile)

    def _adopt_plan(self, profile: ModelProfile | None) -> None:
        """Rank 0 plans from `profile`; every rank takes the plan, moves optimizer state and hooks."""
        payload: list[Any] = [None]
        if self.rank == 0:
            latency, bandwidth = DEFAULT_LATENCY_S, None
            if self.cluster is not None:
                latency, bandwidth = self.cluster.latency_s, self.cluster.bandwidth_bps / 8
            plan = make_ps_plan(profile, self.options, self.shards, latency, bandwidth, self.pull_comm_s,
                                pull_transfers=len(self.engine.plan.pull_buckets),
                                kinds={i: kind_of(self.params[i]) for i in self.engine.plan.params})
            waits: dict[str, list[int]] = {}
            for p in profile.trainable():
                if p.first_use_order is not None:
                    waits.setdefault(profile.modules[p.first_use_order].name, []).append(p.index)
            payload = [(plan.to_dict(), waits)]
        if self.groups.dedicated:
            self._tell_servers(CMD_PLAN)
        dist.broadcast_object_list(payload, src=self.ranks[0], group=self.groups.control)
        plan_d, waits = payload[0]
        plan = PsPlan.from_dict(plan_d)
        old = self.engine
        old.synchronize()
        old.remove_hooks()
        e = PsEngine(self.module, self.optimizer, self.options, plan, self.groups, self.ranks, self.buffer_sync,
                     self.share_buffers)
        e.steps, e.version, e.wait_s, e.sent_hparams = old.steps, dict(old.version), old.wait_s, old.sent_hparams
        move_state(self.optimizer, self.params, old.server_ranks(), e.server_ranks(), self.rank, self.groups.control)
        e.applied = old.applied  # updates applied in the whole run (`stats_dict`)
        if e.stale is not None and old.stale is not None:
            e.stale.scaled_count = old.stale.scaled_count
        if e.stale is not None and e.stale.dc is not None:  # the running mean squares go to the new servers
            e.stale.dc.adopt(gather_mean_sq(old.stale.dc, self.groups.control), e.server_ranks(), self.rank,
                             self.params)
        if self.groups.dedicated:
            send_values(self.params, plan.params, self.ranks, self.groups.control)
        e.set_waits(waits)
        self.unused = [i for i in plan.params if not any(i in v for v in waits.values())]
        self.engine = e

    # --- sync points, state, reports ------------------------------------------------------
    def synchronize(self) -> None:
        if self.released:
            return
        self.engine.synchronize()
        if self.groups.dedicated:
            self._tell_servers(CMD_GATHER)
        gather_full_state(self.optimizer, self.params, self.engine.server_ranks(), self.rank, self.groups.control)
        dc = self.engine.stale.dc if self.engine.stale is not None else None
        if dc is not None and self.engine.world > 1:  # for the checkpoint, as the optimizer state above
            self.dc_mean_sq = gather_mean_sq(dc, self.groups.control)
        self._gathered_at = self.engine.applied
        self.write_trace()

    def _tell_servers(self, code: int) -> None:
        command(self.groups, self.rank, len(self.engine.plan.params), code, self.params[self.engine.plan.params[0]].device)

    def full_state_ready(self) -> bool:
        return self.engine.world == 1 or getattr(self, "_gathered_at", -1) == self.engine.applied

    def after_load(self, state_dict: dict[str, Any]) -> None:
        keep_own_state(self.optimizer, self.params, self.engine.server_ranks(), self.rank)
        self._gathered_at = -1
        if self.groups.dedicated:  # the servers hold the parameters and state they update: send them rank 0's
            send_load(self.groups, self.ranks, self.rank, self.params, state_dict, len(self.engine.plan.params))

    def stats_dict(self) -> dict[str, Any]:
        e, plan = self.engine, self.engine.plan
        steady = self.log[len(self.log) // 4:]
        Es = [x["E"] for x in steady if "E" in x]
        return {"strategy": "ps", "order": plan.order, "consistency": self.options.consistency,
                "placement": plan.placement, "shards": plan.shards, "steps": e.steps,
                "buckets": len(plan.buckets), "bucket_cap_mb": self.options.bucket_cap_mb,
                "pull_buckets": len(plan.pull_buckets), "pull_bucket_cap_mb": self.options.pull_cap_mb(),
                "E_median": statistics.median(Es) if Es else None,
                "S": steady[-1].get("S") if steady and "S" in steady[-1] else None,
                "staleness": [x["staleness"] for x in self.log], "wait_s": e.wait_s,
                "pace_wait_s": e.stale.wait_s if e.stale is not None else 0.0,
                "dc_corrected": e.stale.dc.corrected if e.stale is not None and e.stale.dc is not None else 0,
                "dc_missing": e.stale.dc.missing if e.stale is not None and e.stale.dc is not None else 0,
                # scale: the worker gradients this rank's servers divided by their lag (its shard only)
                "lr_scaled": e.stale.scaled_count if e.stale is not None else 0,
                "updates_applied": e.applied,
                "predicted": plan.predicted, "shard_loads": plan.loads,
                "pull_comm_s": self.pull_comm_s}

    def write_trace(self) -> None:
        if not self.trace_path:
            return
        path = Path(self.trace_path)
        if self.engine.world > 1:
            path = path.with_name(f"{path.stem}.rank{self.rank}{path.suffix or '.json'}")
        events = []
        for x in self.log:
            events.append(TraceEvent(self.rank, "compute", "forward", "forward", x["start_s"], x["forward_s"], x["step"]))
            if x["wait_s"] > 0:
                events.append(TraceEvent(self.rank, "comm", "wait", "pull wait", x["start_s"], x["wait_s"], x["step"]))
        Trace("measured", self.engine.world, events, meta={"ps": self.stats_dict(), "per_step": self.log}).save(path)

    def release(self) -> None:
        if self.released:
            return
        try:
            if all(group_alive(g) for g in self.groups.all()):
                self.engine.synchronize()  # else the job's groups are gone already: nothing can be sent
                if self.groups.dedicated:
                    self._tell_servers(CMD_DONE)  # the servers leave (their scripts exit)
        finally:
            self.released = True
            self.engine.remove_hooks()
            for g in self.groups.all():
                with contextlib.suppress(Exception):
                    dist.destroy_process_group(g)


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

