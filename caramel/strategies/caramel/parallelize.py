"""`parallelize(model, optimizer)`: checks, initial sync, planning, and the engine behind them.

Order at start-up (every rank): check that all ranks hold the same model (one all-gather of a
small signature; a mismatch is an error on every rank, never a hang), broadcast parameters
and buffers from rank 0, create the engine's private communication group, then either take
the given plan (or plan from the given profile on rank 0 and broadcast it), or run a short
online profiling phase inside the user's own first steps and switch to the real plan at the
same step on every rank.
"""
from __future__ import annotations

import atexit
import json
import os
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.topology.spec import ClusterSpec
from caramel.distributed import gloo_group, init_distributed, resolve_timeout_s
from caramel.errors import CaramelError, MismatchError
from caramel.plan.plan import Plan
from caramel.strategies.planners import make_plan
from caramel.profile.model_profile import ModelProfile, model_fingerprint
from caramel.profile.profiler import StepTimer, UseTracker, build_profile, dtype_name, unique_params
from caramel.runtime.buffer_sync import BufferSync, buffer_mode
from caramel.runtime.comm_priority import CommPriority
from caramel.runtime.engine import RELEASED, Engine
from caramel.runtime.model import CaramelModel
from caramel.runtime.optimizer import steps_per_parameter, wrap_optimizer
from caramel.profile.tied import find_tied_embeddings
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.caramel.trial import AUTO_CANDIDATES, DDP_SCHEDULE, Candidate, OverlapTrial, trial_preference
from caramel.trace.recorder import Recorder

_GROUP_COUNTER = [0]
LATENCY_PROBES = 8  # tiny all-reduces timed after the profiling steps (see _measure_latency_s)
_LIVE_ENGINES: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def shutdown() -> None:
    """Release the private communication groups of every model parallelized in this process.

    Runs by itself at interpreter exit (before module teardown, so gloo's threads are joined
    while the interpreter is intact); call it earlier to free them, e.g. before
    `dist.destroy_process_group()`. Pending updates are applied first. A model used after
    shutdown raises an error naming it. Idempotent.
    """
    import gc

    for engine in list(_LIVE_ENGINES):
        engine.release()
    gc.collect()


atexit.register(shutdown)


def parallelize_caramel(model: nn.Module, optimizer: torch.optim.Optimizer, options: CaramelOptions, *,
                        process_group: Any = None, broadcast_buffers: bool | str = True,
                        find_unused_parameters: bool | None = None, plan: Plan | str | os.PathLike | None = None,
                        profile: ModelProfile | str | os.PathLike | None = None, cluster: ClusterSpec | None = None,
                        trace: str | os.PathLike | None = None, timeout_s: float | None = None,
                        ) -> tuple[CaramelModel, torch.optim.Optimizer]:
    """Wrap `model` and `optimizer` for data-parallel training with Caramel's engine.

    Returns `(model, optimizer)`: a DDP-like wrapper module and the same optimizer object,
    whose `step()` may defer updates to the next forward (`overlap="forward"`), and whose
    `synchronize()` applies every pending update. `overlap="auto"` (the default) times the
    planner's "forward" and "backward" plans and DDP's schedule for a few steps each after
    planning and keeps the fastest (`caramel.strategies.caramel.trial`).
    """
    planner, overlap = options.planner, options.overlap
    trial_steps, trial_passes = options.trial_steps, options.trial_passes
    comm_priority, split_tied = options.comm_priority, options.split_tied
    profile_steps, check_every, replan = options.profile_steps, options.check_every, options.replan
    planner_options = options.planner_options()
    find_unused_parameters = True if find_unused_parameters is None else find_unused_parameters
    if not isinstance(model, nn.Module):
        raise CaramelError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise CaramelError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(model, CaramelModel) or hasattr(optimizer, "_caramel_engine"):
        raise CaramelError("model or optimizer is already parallelized")
    buffers = buffer_mode(broadcast_buffers)
    if not isinstance(find_unused_parameters, bool):
        raise CaramelError(f"find_unused_parameters must be True or False, got {find_unused_parameters!r}")
    # every check that can fail runs before anything is created or changed, so that bad input
    # leaves nothing behind (a default process group made here is destroyed again); with
    # several ranks, what one rank finds wrong is raised on every rank after one all-gather
    names, params = unique_params(model)
    _check_optimizer_params(optimizer, params)
    signature = [(n, list(p.shape), dtype_name(p.dtype), p.requires_grad) for n, p in zip(names, params)]
    fingerprint = model_fingerprint(signature)
    made_default_group = not dist.is_initialized()
    if made_default_group:
        init_distributed(timeout_s=timeout_s)
    try:
        group = process_group or dist.group.WORLD
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        input_error = None
        try:
            plan = _load(plan, Plan) if plan is not None else None
            profile = _load(profile, ModelProfile) if profile is not None and plan is None else None
            if world > 1:
                _check_inputs_match(plan, profile, names, fingerprint, world)
        except CaramelError as e:
            if world == 1:
                raise
            input_error, plan, profile = str(e), None, None
        # one process has no communication threads: nothing to raise, nothing to refuse
        prio = CommPriority.resolve(comm_priority if world > 1 else "normal")
        if comm_priority == "realtime" and prio.reason is not None and input_error is None:
            input_error = (f"comm_priority='realtime': {prio.reason}; pass comm_priority='auto' to fall back to "
                           "normal priority")
        # planner options are not compared: only rank 0 plans
        options = {"planner": planner, "overlap": overlap, "split_tied": split_tied, "broadcast_buffers": broadcast_buffers,
                   "find_unused_parameters": find_unused_parameters, "profile_steps": profile_steps,
                   "check_every": check_every, "replan": replan, "trial_steps": trial_steps, "trial_passes": trial_passes,
                   "comm_priority": comm_priority,
                   "plan": plan.fingerprint if plan is not None else None, "profile given": profile is not None,
                   "cluster": json.dumps(cluster.to_dict(), sort_keys=True, default=str) if cluster is not None else None}
        _check_same_model(signature, fingerprint, group, rank, world, options, input_error)
    except BaseException:
        if made_default_group:
            dist.destroy_process_group()
        raise
    _broadcast_state(model, group, world)
    _GROUP_COUNTER[0] += 1
    comm = (gloo_group(f"grad{_GROUP_COUNTER[0]}", group, threads=1, timeout_s=timeout_s, priority=prio)
            if world > 1 else _LocalGroup())
    trace_path = _trace_path(trace, rank, world)
    recorder = Recorder(rank, world, enabled=trace_path is not None)
    lazy_ok = steps_per_parameter(optimizer)
    auto = overlap == "auto"
    if auto and not lazy_ok:
        auto, overlap = False, "backward"  # updates cannot be split per bucket: nothing to try
    engine = Engine(model, optimizer, params, names, comm, world, rank, AUTO_CANDIDATES[0] if auto else overlap,
                    recorder, resolve_timeout_s(timeout_s))
    wrap_optimizer(optimizer, engine)
    controller = _Controller(engine, model, names, params, group, rank, world, planner, cluster, planner_options,
                             fingerprint, lazy_ok, profile_steps, check_every, replan,
                             trial_steps=trial_steps if auto else 0, broadcast_buffers=buffers is not None,
                             trial_passes=trial_passes, find_unused_parameters=find_unused_parameters,
                             comm_priority=prio)
    engine.controller = controller
    tied = find_tied_embeddings(model, params) if world > 1 and split_tied else []
    if tied:  # before any plan or profile, which see the split
        engine.split_tied(tied, gloo_group(f"rows{_GROUP_COUNTER[0]}", group, threads=1, timeout_s=timeout_s,
                                           priority=prio))
    if world == 1:
        if recorder.enabled:
            engine._install_forward_hooks()  # passthrough: no plan; forward events for the trace
    elif plan is not None:
        modes = AUTO_CANDIDATES if auto else (overlap,)
        controller.adopt_or_try([Candidate(f"plan/{m}", m, plan) for m in modes], source="plan", planner="plan")
    elif profile is not None:
        controller.plan_from_profile(profile)
    else:
        controller.start_profiling()
    if buffers and world > 1 and any(True for _ in model.buffers()):
        sync = BufferSync(model, engine, gloo_group(f"buf{_GROUP_COUNTER[0]}", group, threads=1, timeout_s=timeout_s,
                                                    priority=prio), mode=buffers)
        engine.group_holders.append(sync)
        # first of the model's pre-hooks, as DDP broadcasts before the module runs: the broadcast
        # waits for the slowest peer, which is communication, not forward time, so the online
        # profile's forward and the trace's compute leave it out (the simulator does not model
        # it; the trace shows it as a wait just before the forward, at the end of the previous
        # step's window)
        model.register_forward_pre_hook(sync.pre_forward, prepend=True)
        model.register_forward_hook(sync.post_forward, always_call=True)
    if world > 1:
        engine.comm_priority = prio
    wrapped = CaramelModel(model, engine)
    _LIVE_ENGINES.add(engine)
    if trace_path is not None:
        _save_at_exit(engine, trace_path)
    return wrapped, optimizer


class _LocalGroup:
    """World size 1, or muted communication: the 'collective' is already done."""

    class _Done:
        def wait(self) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

        def get_future(self):
            fut = torch.futures.Future()
            fut.set_result(None)
            return fut

    def allreduce(self, tensors):
        return self._Done()

    def allgather(self, outputs, inputs):
        # this rank's input in the first slot, empty slots after it (a zero row count)
        out = outputs[0]
        out[0].copy_(inputs[0])
        for t in out[1:]:
            t.zero_()
        return self._Done()


def schedule_settled(optimizer: torch.optim.Optimizer) -> bool:
    """True once the engine behind `optimizer` has settled on its schedule: online profiling and
    any overlap trial are over (they end at the same step on every rank). It stays True until a
    re-plan (a changed module order, `replan="auto"`) starts a new profile or trial."""
    engine = getattr(optimizer, "_caramel_engine", None)
    if engine is None:
        raise CaramelError("schedule_settled: the optimizer is not one that caramel.parallelize returned")
    return engine.controller is None or engine.controller.settled()


def mute_gradient_communication(optimizer: torch.optim.Optimizer) -> None:
    """Headroom analysis, the engine's twin of torch DDP's `noop_hook`: from now on every gradient
    collective of the engine behind `optimizer` is a no-op, so each rank updates with its own
    gradients, pre-divided by the world size as always, while the hooks, bucket copies, buffer
    broadcasts and lazy updates run as usual.

    For timing what the engine costs besides the network (`experiments.validation.calibrate`);
    never for training. Refused while online profiling or the overlap trial runs (they choose
    from timed collectives; `schedule_settled` tells when they are over). Pending collectives
    finish first. The schedule in force then stays (no re-profile, no re-plan). Irreversible
    for this engine.
    """
    engine = getattr(optimizer, "_caramel_engine", None)
    if engine is None:
        raise CaramelError("mute_gradient_communication: the optimizer is not one that caramel.parallelize returned")
    if engine.comm is None:
        raise CaramelError(RELEASED)
    controller = engine.controller
    if controller is not None and (controller.profiling or controller.trial is not None):
        # both time the collectives and choose from what they saw, and the trial may hand the
        # job to torch DDP, whose collectives no mute reaches
        raise CaramelError("mute_gradient_communication: the engine is still choosing its schedule "
                           f"({'online profiling' if controller.profiling else 'overlap trial'}); "
                           "mute it once schedule_settled(optimizer) is True, or parallelize with a plan")
    if engine.delegating:
        raise CaramelError("mute_gradient_communication: this engine handed its schedule to torch DDP; "
                           "register torch's noop_hook on that DDP module instead")
    engine.synchronize()
    if controller is not None:
        controller.muted = True  # no new profile or plan from muted collectives' timings
    engine.comm = _LocalGroup()
    for ex in engine.row_exchanges:
        ex.pg = _LocalGroup()


class _Controller:
    """Planning: the online profiling phase, planning on rank 0, broadcast, periodic checks."""

    def __init__(self, engine: Engine, model: nn.Module, names, params, group, rank: int, world: int,
                 planner: str, cluster: ClusterSpec | None, planner_options: dict, fingerprint: str,
                 lazy_ok: bool, profile_steps: int, check_every: int, replan: str = "off", trial_steps: int = 0,
                 broadcast_buffers: bool = True, trial_passes: int = 1, find_unused_parameters: bool = True,
                 comm_priority: CommPriority | None = None):
        self.engine, self.model, self.names, self.params = engine, model, names, params
        self.group, self.rank, self.world = group, rank, world
        self.planner, self.cluster, self.planner_options = planner, cluster, planner_options
        self.fingerprint, self.lazy_ok = fingerprint, lazy_ok
        self.profile_steps, self.check_every = profile_steps, check_every
        self.replan = replan
        if replan == "auto":
            # the engine times its collectives; agreement on a new bandwidth is checked often
            engine.measure_comm = True
            self.check_every = min(check_every or 10, 10)
        self.plan_cluster: ClusterSpec | None = None
        self.profile: ModelProfile | None = None
        self.module_uses: dict[str, list[int]] | None = None
        self.profiling = False
        self.hooks_installed = False
        self.uses_pending = False
        self.use_tracker: UseTracker | None = None
        self.order_replans = 0
        self.trial_steps = trial_steps  # > 0: overlap="auto", every new plan starts a trial
        self.trial: OverlapTrial | None = None
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.comm_priority = comm_priority or CommPriority("normal")
        self.trial_passes = trial_passes
        self.muted = False  # mute_gradient_communication: the schedule in force stays
        engine.on_step_end = self.on_step_end

    # -- the plan in force
    def adopt(self, plan: Plan, source: str) -> None:
        self.engine.synchronize()
        self.engine.take_back()
        plan.check_model(self.fingerprint, self.names, source=source)
        if plan.world_size != self.world:
            raise MismatchError(f"{source}: plan was made for {plan.world_size} workers, this job has {self.world}")
        self._check_same_plan(plan)
        order = [m.name for m in self.profile.modules] if self.profile is not None else None
        self.engine.set_plan(plan, self.module_uses, order)
        self.engine.order_changed = False
        self.engine.sync_apply = self.engine.overlap != "forward" or not self.lazy_ok
        if self.module_uses is None and not self.engine.sync_apply:
            # A plan without a profile says nothing about which module uses which parameter
            # (MultiheadAttention reads out_proj.weight without calling out_proj): apply at
            # step() until one forward has been watched, then switch to lazy updates.
            self.engine.sync_apply = True
            self.uses_pending = True
            self._install_hooks()

    def trial_specs(self) -> list[tuple[str, str, str]]:
        """(name, planner, overlap) of every schedule a new profile is planned for: the one asked,
        or with overlap="auto" the planner's plan for each mode and DDP's schedule (fifo)."""
        if not self.trial_steps:
            return [(f"{self.planner}/{self.engine.overlap}", self.planner, self.engine.overlap)]
        specs = [(f"{self.planner}/{m}", self.planner, m) for m in AUTO_CANDIDATES]
        if self.planner != "fifo":
            specs.append((DDP_SCHEDULE, "fifo", "backward"))
        return specs

    def adopt_or_try(self, cands: list[Candidate], source: str, planner: str | None = None) -> None:
        """Adopt the one candidate, or start a trial of them all (overlap="auto"); `planner` is the
        prefix of the candidates' names (this controller's planner unless given)."""
        if not self.trial_steps:
            assert len(cands) == 1
            self.adopt(cands[0].plan, source=source)
            return
        # a plan the user gave carries one prediction, for the mode it was made for, whatever
        # mode its candidates run; the planner's plans each carry their own mode's
        predicted = None if planner == "plan" else {c.name: c.plan.predicted_step_time_s for c in cands}
        preference = trial_preference([c.name for c in cands], planner or self.planner, predicted)
        self.trial = OverlapTrial(cands, self.trial_steps, self.group, self.world, preference=preference,
                                  max_passes=self.trial_passes, predicted_s=predicted)
        self._adopt_candidate(self.trial.current, source)

    def _adopt_candidate(self, cand: Candidate, source: str) -> None:
        # adopt() first applies every pending update, whichever mode deferred it, and takes the
        # gradients back from torch DDP; DDP's schedule is then handed to torch DDP itself, in
        # the trial too, so the candidates are timed against what the user would otherwise run
        self.engine.overlap = cand.overlap
        self.adopt(cand.plan, source=f"{source} ({cand.name})")
        if cand.name == DDP_SCHEDULE:
            self._delegate_to_ddp()

    def settled(self) -> bool:
        """True once profiling and any overlap trial are over: the schedule in force is the final one."""
        return not self.profiling and self.trial is None and not self.uses_pending

    def _check_same_plan(self, plan: Plan) -> None:
        if self.world == 1:
            return
        prints: list[Any] = [None] * self.world
        dist.all_gather_object(prints, plan.fingerprint, group=self.group)
        if len(set(prints)) != 1:
            raise MismatchError("ranks hold different plans: fingerprints " + ", ".join(f"rank {r}: {f}" for r, f in enumerate(prints)))

    def plan_from_profile(self, profile: ModelProfile, cluster: ClusterSpec | None = None) -> None:
        if profile.fingerprint() != self.fingerprint:
            raise MismatchError(f"profile of model {profile.model!r} does not match this model's parameters "
                                f"(profile has {len(profile.params)} parameters, model has {len(self.params)})")
        self.profile = profile
        self.module_uses = _module_uses(profile)
        data = [None]
        cluster = cluster or self.cluster or _default_cluster(self.world)
        self.plan_cluster = cluster
        specs = self.trial_specs()
        if self.rank == 0:
            # the user's planner options are for the user's planner; DDP's schedule keeps its defaults
            data = [[make_plan(planner, profile, cluster, world_size=self.world, overlap=overlap,
                               **(self.planner_options if planner == self.planner else {})).to_dict()
                     for _, planner, overlap in specs]]
        if self.world > 1:
            dist.broadcast_object_list(data, src=dist.get_global_rank(self.group, 0) if self.group is not dist.group.WORLD else 0, group=self.group)
        cands = [Candidate(name, overlap, Plan.from_dict(d, source="plan from rank 0"))
                 for (name, _, overlap), d in zip(specs, data[0])]
        self.adopt_or_try(cands, source="plan from rank 0")

    # -- online profiling inside the user's first steps
    def start_profiling(self) -> None:
        """A provisional DDP-like plan (reverse registration order) while the first steps are measured."""
        trainable = [i for i, p in enumerate(self.params) if p.requires_grad]
        if not trainable:
            raise CaramelError("model has no trainable parameters (every parameter has requires_grad=False)")
        provisional = _registration_profile(self.names, self.params)
        plan = make_plan("fifo", provisional, world_size=self.world)
        self.engine.synchronize()
        self.engine.take_back()
        # a trial still running (a changed module order seen by a periodic check mid-trial) ends
        # here: its candidates were planned from the old profile, and adopting one would replace
        # the provisional plan the profiling steps measure; the new plans start a new trial
        self.trial = None
        self.profile = None
        # the provisional plan's collectives are timed too: without a cluster spec from the
        # user, the plan is made for the link bandwidth they show
        self._measure_before = self.engine.measure_comm
        self.engine.measure_comm = True
        self.engine.comm_log.clear()
        self.engine.set_plan(plan, None)
        self.engine.sync_apply = True
        self.phase_step = 0
        self.tracker: UseTracker | None = None
        self.timer: StepTimer | None = None
        self._install_hooks()
        self.engine.on_grad_ready.append(self._grad_ready)
        self.engine.on_backward_end.append(self._bwd_end)
        for ex in self.engine.row_exchanges:
            ex.tied.on_rows_ready = self._rows_ready
        self.profiling = True

    def _install_hooks(self) -> None:
        if not self.hooks_installed:
            self.model.register_forward_pre_hook(self._fwd_pre)
            self.model.register_forward_hook(self._fwd_post, always_call=True)
            self.hooks_installed = True

    def _fwd_pre(self, _m, _args):
        if self.uses_pending and self.use_tracker is None:
            self.use_tracker = UseTracker(self.model, self.params)
            self.use_tracker.__enter__()
            return
        if not self.profiling or not torch.is_grad_enabled():
            return
        if self.phase_step == 1 and self.tracker is None:
            self.tracker = UseTracker(self.model, self.params)
            self.tracker.__enter__()
        elif self.phase_step >= 2 and self.timer is not None and self.timer.cur is None:
            self.timer.forward_start()

    def _fwd_post(self, _m, _args, _out):
        if self.use_tracker is not None and self.use_tracker._mode is not None:
            self.use_tracker.__exit__(None, None, None)
            self.use_tracker._mode = None
            return
        if not self.profiling:
            return
        if self.tracker is not None and self.tracker._mode is not None and self.phase_step == 1:
            self.tracker.__exit__(None, None, None)
            self.tracker._mode = None
        elif self.timer is not None and self.timer.cur is not None:
            self.timer.backward_start()

    def _grad_ready(self, idx: int) -> None:
        if self.timer is not None:
            self.timer.grad_ready(idx)

    def _rows_ready(self, idx: int) -> None:
        if self.timer is not None:
            self.timer.rows_ready(idx)

    def _bwd_end(self) -> None:
        if self.timer is not None and self.timer.cur is not None:
            self.timer.backward_end()
        self._t_bwd_end = time.perf_counter()
        self._wait_at_bwd_end_s = self.engine.wait_this_step_s

    def on_step_end(self) -> None:
        if self.uses_pending and self.use_tracker is not None and self.use_tracker._mode is None:
            uses: dict[str, list[int]] = {}
            for idx, mods in self.use_tracker.use_modules.items():
                for m in mods:
                    uses.setdefault(m, []).append(idx)
            self.module_uses = uses
            self.uses_pending = False
            self.engine.set_plan(self.engine.plan, uses, self.use_tracker.module_order)
            self.engine.sync_apply = self.engine.overlap != "forward" or not self.lazy_ok
            self.use_tracker = None
        if self.trial is not None:
            self._trial_step_end()
        if self.profiling:
            self._profiling_step_end()
        elif self.check_every and self.engine.stats.step % self.check_every == 0:
            self._periodic_check()

    def _trial_step_end(self) -> None:
        nxt = self.trial.record(self.engine.stats.last_step_s)
        if nxt is None:
            return
        if self.trial.result is not None:
            self.engine.stats.extra["overlap_trial"] = self.trial.result
            self.trial = None
        # the same candidate again (the winner ran last, or a new pass starts with it): no switch
        if not (nxt.plan is self.engine.plan and nxt.overlap == self.engine.overlap):
            self._adopt_candidate(nxt, source="overlap trial")

    def _delegate_to_ddp(self) -> None:
        """DDP's schedule was chosen: let torch DDP itself run it (Engine.delegate_to), at the same
        step on every rank. Its constructor checks the parameters' shapes and broadcasts rank
        0's parameters and buffers: collectives every rank makes here, on values already equal."""
        from torch.nn.parallel import DistributedDataParallel

        self.engine.synchronize()
        ddp = self.engine.ddp
        if ddp is None:
            # With the search for unused parameters unless the user vouches that every parameter
            # gets a gradient in every step: a parameter can go unused in any later step (a
            # data-dependent branch), which DDP without the search turns into an error at the
            # next forward, after a step on partly reduced gradients; the search walks the
            # autograd graph every step (~3% of a ResNet-18 step here). broadcast_buffers=False keeps rank-local buffers
            # rank-local, also at construction (torch's own advice while it deprecates the flag),
            # so it is passed only then.
            kwargs = {} if self.broadcast_buffers else {"broadcast_buffers": False}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ddp = DistributedDataParallel(self.model, process_group=self._ddp_group(),
                                              find_unused_parameters=self.find_unused_parameters, **kwargs)
        self.engine.delegate_to(ddp)

    def _ddp_group(self):
        """The group torch DDP runs on after a hand-over. The trial timed DDP's schedule on the
        engine's own threads, so unless `comm_priority="normal"`, when the job's group is the
        default gloo group, DDP gets a new gloo group over it whose threads get what the engine's
        got (real-time where allowed; decided by the mode, the same on every rank, so that every
        rank makes the group); otherwise the job's group itself (a subgroup cannot be copied
        without every process of the job taking part). Released with the engine."""
        if self.comm_priority.mode == "normal" or self.group is not dist.group.WORLD or dist.get_backend(self.group) != "gloo":
            return self.group
        import datetime

        timeout = datetime.timedelta(seconds=self.engine.timeout_s)
        self.engine.ddp_group = self.comm_priority.start(lambda: dist.new_group(backend="gloo", timeout=timeout))
        return self.engine.ddp_group

    def _periodic_check(self) -> None:
        """Every `check_every` steps, on every rank: one all-reduce (MAX) of the plan fingerprint,
        its negation, and whether modules ran out of the profiled order. Disagreeing plans are
        an error; a changed order (updates stay correct: each module applies what it uses, but
        the priorities are stale) triggers a new profile, at most twice, at the same step everywhere."""
        h = int(self.engine.plan.fingerprint[:12], 16)
        bw = None
        if self.replan == "auto" and self.plan_cluster is not None:
            bw = self.engine.measured_bandwidth_bps(self.plan_cluster.latency_s, self.plan_cluster.effective_queued_latency_s)
        calls = self.engine.step_calls
        t = torch.tensor([h, -h, int(self.engine.order_changed), int(bw // 1000) if bw else 0, calls, -calls],
                         dtype=torch.int64)
        if self.world > 1:
            try:
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            except Exception as e:  # noqa: BLE001 - re-raised with context
                raise RuntimeError(f"caramel: rank {self.rank}: all-reduce of the plan check (step {self.engine.stats.step}) failed: {e}. "
                                   f"A peer may have died or hung (timeout {self.engine.timeout_s:g} s)") from e
        if int(t[4]) != calls or int(-t[5]) != calls:
            raise MismatchError(f"rank {self.rank}: ranks disagree on the step: this rank has made {calls} optimizer.step() "
                                f"calls, another rank between {int(-t[5])} and {int(t[4])}; a rank skipped or added a gradient "
                                "reduction (no_sync or a backward on some ranks only), so gradients of different steps were averaged")
        if int(t[0]) != h or int(-t[1]) != h:
            raise MismatchError(f"rank {self.rank}: ranks disagree on the plan at step {self.engine.stats.step} "
                                f"(this rank's fingerprint {self.engine.plan.fingerprint}); they would reduce mismatched gradients")
        self.engine.order_changed = False
        if int(t[2]):
            self.engine.stats.extra["order_changes"] = self.engine.stats.extra.get("order_changes", 0) + 1
            if self.order_replans < 2 and not self.muted:
                self.order_replans += 1
                self.start_profiling()
                return
        if int(t[3]) > 0 and self.profile is not None and self.plan_cluster is not None and not self.muted:
            self._maybe_replan_bandwidth(float(t[3]) * 1000)

    def _maybe_replan_bandwidth(self, measured_bps: float) -> None:
        """`replan="auto"`: the best measurement of any rank (all ranks hold the same number)
        differs from what the plan assumed by more than 2x: re-plan for it, on every rank now."""
        assumed = self.plan_cluster.bandwidth_bps
        ratio = measured_bps / assumed
        self.engine.stats.extra["measured_bandwidth_bps"] = measured_bps
        if 0.5 <= ratio <= 2.0:
            return
        import dataclasses
        cluster = dataclasses.replace(self.plan_cluster, bandwidth_bps=measured_bps,
                                      meta=dict(self.plan_cluster.meta, measured_at_step=self.engine.stats.step))
        self.plan_from_profile(self.profile, cluster)
        self.engine.stats.replans += 1
        log = self.engine.stats.extra.setdefault("bandwidth_replans", [])
        log.append({"step": self.engine.stats.step, "assumed_bps": assumed, "measured_bps": measured_bps,
                    "plan": self.engine.plan.fingerprint})

    def _profiling_step_end(self) -> None:
        if self.timer is not None and self.timer.cur is not None:
            # the optimizer's own time: step() first waits for this step's collectives (the
            # provisional plan applies at step()), and that wait is communication, which the
            # simulator models itself; counted as compute it made every plan's apply cost
            # the whole exposed communication (136 ms instead of ~5 for GPT-2 at 1 Gbit/s)
            elapsed_s = time.perf_counter() - getattr(self, "_t_bwd_end", time.perf_counter())
            waited_s = self.engine.stats.last_wait_s - getattr(self, "_wait_at_bwd_end_s", 0.0)
            self.timer.step_end(max(0.0, elapsed_s - waited_s))
        self.phase_step += 1
        if self.phase_step == 2:
            assert self.tracker is not None
            self.timer = StepTimer(self.model, self.tracker.module_order)
        if self.phase_step < 2 + self.profile_steps:
            return
        self.profiling = False
        self.engine.on_grad_ready.remove(self._grad_ready)
        self.engine.on_backward_end.remove(self._bwd_end)
        for ex in self.engine.row_exchanges:
            ex.tied.on_rows_ready = None
        self.timer.remove()
        profile = build_profile(type(self.model).__name__, 0, self.model, self.tracker, self.timer.samples,
                                meta={"online": True, "rank": self.rank})
        cluster = None if self.cluster is not None else self._measured_cluster()
        self.engine.measure_comm = self._measure_before
        self.plan_from_profile(profile, cluster)
        self.engine.stats.replans += 1

    def _measured_cluster(self) -> ClusterSpec | None:
        """The default cluster with the per-collective latencies and the bandwidth this job
        shows: tiny all-reduces on the engine's own group for the latency on an idle link, the
        profiling steps' collectives for the bandwidth, then back-to-back pieces for the latency
        of a queued collective (`_measure_queued_latency_s`). The slowest rank's latencies, the
        best rank's bandwidth: one all-reduce each, on every rank at the same step."""
        import dataclasses

        from caramel.topology.probe import host_core_share

        base = _default_cluster(self.world)
        latency_s, lone_cpu_s = self._measure_latency_s()
        # every collective at the lone latency, only to size the queued probe (the same on every rank)
        rough_bps = self._agreed_bps(self.engine.measured_bandwidth_bps(latency_s, clear=False))
        queued_s, cpu_s = self._measure_queued_latency_s(latency_s, rough_bps or base.bandwidth_bps)
        if cpu_s is None:  # no queued probe: each tiny probe's CPU time
            cpu_s = lone_cpu_s
        measured_bps = self._agreed_bps(self.engine.measured_bandwidth_bps(latency_s, queued_s))
        self.engine.stats.extra["measured_latency_s"] = latency_s
        self.engine.stats.extra["measured_queued_latency_s"] = queued_s
        # a collective's CPU time slows the model's compute only when both run on the CPU, and
        # where ranks share cores, every one of them by that CPU time times the share (asked
        # on every rank alike: it is a collective, and devices may differ between ranks)
        on_cpu = all(p.device.type == "cpu" for p in self.params)
        share = host_core_share(self.group)
        self.engine.stats.extra["measured_collective_cpu_s"] = cpu_s
        self.engine.stats.extra["measured_core_share"] = share
        meta = dict(base.meta, measured="profiling steps", latency_probes=LATENCY_PROBES, core_share=share)
        base = dataclasses.replace(base, latency_s=latency_s, queued_latency_s=queued_s, meta=meta,
                                   collective_cpu_s=cpu_s * share if on_cpu else 0.0)
        if measured_bps <= 0:
            return base
        self.engine.stats.extra["measured_bandwidth_bps"] = measured_bps
        return dataclasses.replace(base, bandwidth_bps=measured_bps)

    def _agreed_bps(self, bandwidth_bps: float | None) -> float:
        """The best rank's bandwidth (0 when no rank could tell), the same on every rank."""
        t = torch.tensor([int(bandwidth_bps // 1000) if bandwidth_bps else 0], dtype=torch.int64)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t[0]) * 1000

    def _measure_latency_s(self) -> tuple[float, float]:
        """Per-step latency alpha of the ring model on an idle link: the mean time of
        `LATENCY_PROBES` tiny all-reduces on the engine's group, over the 2(n-1) steps of a
        ring; and the process CPU time each took (the slowest rank's of both). The mean, not the
        fastest: a plan pays each collective's typical cost, and on a virtual machine whose idle
        CPUs halt that includes waking the backend's thread (0.4 ms at best, 2-4 ms in half of
        the tries on the 2-core test host, where the default assumes 50 us)."""
        assert self.world > 1, "one process plans without profiling: no collectives to time"
        buf = torch.zeros(256)
        self.engine.comm.allreduce([buf]).wait()  # the first may still be connecting
        times = []
        c0 = time.process_time()
        for _ in range(LATENCY_PROBES):
            t0 = time.perf_counter()
            self.engine.comm.allreduce([buf]).wait()
            times.append(time.perf_counter() - t0)
        cpu_s = (time.process_time() - c0) / LATENCY_PROBES
        mean = torch.tensor([sum(times) / len(times), cpu_s], dtype=torch.float64)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX, group=self.group)
        return float(mean[0]) / (2 * (self.world - 1)), max(float(mean[1]), 0.0)

    def _measure_queued_latency_s(self, latency_s: float, bandwidth_bps: float) -> tuple[float | None, float | None]:
        """Per-step latency of a collective issued while the link is still busy with the one
        before it, at most `latency_s`, and the CPU time each collective costs a worker
        (`caramel.topology.probe.measure_queued_extra` on the engine's group, pieces sized for
        `bandwidth_bps`, the same on every rank; the slowest rank's of each); (None, None) when no
        piece of a sensible size takes long enough to tell (a link so fast that every collective
        pays its whole latency). A plan's back-to-back buckets cost far less time each than a lone
        collective (0.19-0.28 ms per message against 0.25-1.45 ms on the emulated cluster), but
        not less CPU; the probe takes about 320 lone collectives' time (under a second there)."""
        from caramel.topology.probe import measure_queued_extra, queued_latency_from_extra_s, queued_piece_bytes

        piece = queued_piece_bytes(latency_s, bandwidth_bps, self.world)
        if piece is None:
            return None, None
        m = measure_queued_extra(self.engine.comm, piece)
        t = torch.tensor([m.extra_s, m.cpu_s], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        self.engine.stats.extra["measured_queued_extra_s"] = float(t[0])
        return queued_latency_from_extra_s(float(t[0]), latency_s, self.world), max(float(t[1]), 0.0)


def _module_uses(profile: ModelProfile) -> dict[str, list[int]]:
    uses: dict[str, list[int]] = {}
    for p in profile.params:
        for m in p.use_modules:
            uses.setdefault(m, []).append(p.index)
    return uses


def _registration_profile(names: list[str], params: list[nn.Parameter]) -> ModelProfile:
    """A timing-free profile: planners fall back to reverse registration order (DDP's first guess)."""
    from caramel.profile.model_profile import ParamInfo
    infos = [ParamInfo(i, n, list(p.shape), dtype_name(p.dtype), p.numel(), p.numel() * p.element_size(), p.requires_grad)
             for i, (n, p) in enumerate(zip(names, params))]
    return ModelProfile("provisional", 0, 0.0, 0.0, 0.0, infos, [])


def _default_cluster(world: int) -> ClusterSpec:
    try:
        from caramel.strategies.caramel.planner import default_cluster
        return default_cluster(world)
    except ImportError:
        return ClusterSpec.uniform(world, 1e9)


def _check_optimizer_params(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    ids = {id(p) for p in params}
    for gi, g in enumerate(optimizer.param_groups):
        for p in g["params"]:
            if id(p) not in ids:
                raise CaramelError(f"optimizer param_groups[{gi}] holds a tensor of shape {tuple(p.shape)} that is not a parameter of the model")


def _check_inputs_match(plan: Plan | None, profile: ModelProfile | None, names: list[str], fingerprint: str,
                        world: int) -> None:
    """A given plan or profile is for this model (and a plan for this many workers)."""
    if plan is not None:
        plan.check_model(fingerprint, names, source="plan")
        if plan.world_size != world:
            raise MismatchError(f"plan: plan was made for {plan.world_size} workers, this job has {world}")
    if profile is not None and profile.fingerprint() != fingerprint:
        raise MismatchError(f"profile of model {profile.model!r} does not match this model's parameters "
                            f"(profile has {len(profile.params)} parameters, model has {len(names)})")


def _check_same_model(signature, fingerprint: str, group, rank: int, world: int, options: dict[str, Any],
                      input_error: str | None = None) -> None:
    """Every rank holds the same model, passed the same options to `parallelize`, and found its
    plan or profile fit for it (`input_error`: what `_check_inputs_match` said on this rank). One
    all-gather: a mismatch on any rank is the same error on every rank, never a hang or a silent mix."""
    if world == 1:
        return
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (fingerprint, signature, options, input_error), group=group)
    # the models first, then each rank's plan or profile, then the options: the first
    # difference found is the cause the message names
    _check_same_signature([(fp, sig) for fp, sig, _, _ in gathered])
    for r, (*_, error) in enumerate(gathered):
        if error is not None:
            raise MismatchError(f"rank {r}: {error}")
    for key in options:
        values = [opts.get(key) for _, _, opts, _ in gathered]
        if len(set(values)) > 1:
            label = {"plan": "plans (fingerprints)", "cluster": "clusters"}.get(key, key)
            raise MismatchError(f"ranks passed different {label} to parallelize: "
                                + ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
                                + "; every rank must pass the same options")


def _check_same_signature(gathered: list[tuple[str, list]]) -> None:
    """Every rank's (fingerprint, parameter signature) equals rank 0's; the error names the first difference."""
    ref_fp, ref = gathered[0]
    for r, (fp, sig) in enumerate(gathered):
        if fp == ref_fp:
            continue
        if len(sig) != len(ref):
            raise MismatchError(f"rank {r} has a model with {len(sig)} parameters, rank 0 has {len(ref)}")
        for a, b in zip(ref, sig):
            if a != b:
                field = ("name", "shape", "dtype", "requires_grad")[next(i for i in range(4) if a[i] != b[i])]
                raise MismatchError(f"rank {r}'s model differs from rank 0's in the {field} of parameter {a[0]!r}: "
                                    f"{b[('name', 'shape', 'dtype', 'requires_grad').index(field)]} vs {a[('name', 'shape', 'dtype', 'requires_grad').index(field)]}")
        raise MismatchError(f"rank {r}'s model differs from rank 0's")


def _broadcast_state(model: nn.Module, group, world: int) -> None:
    if world == 1:
        return
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=src, group=group)


def _load(obj, cls):
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return cls.load(obj)
    raise CaramelError(f"expected a {cls.__name__} or a path to one, got {type(obj).__name__}")


def _trace_path(trace, rank: int, world: int) -> Path | None:
    if trace is None:
        env = os.environ.get("CARAMEL_TRACE")
        if not env:
            return None
        return Path(env) / f"trace.rank{rank}.json"
    path = Path(trace)
    if world > 1:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix or '.json'}")
    return path


def _save_at_exit(engine: Engine, path: Path) -> None:
    ref = weakref.ref(engine)
    engine.trace_path = path

    def save():
        e = ref()
        if e is not None and e.recorder.enabled:
            meta = {"plan": e.plan.fingerprint if e.plan else None, "overlap": e.overlap}
            try:
                meta.update(_save_plan_inputs(e, path))
            except (OSError, ValueError) as err:  # the trace matters more than the plan's inputs
                warnings.warn(f"caramel: could not write the plan's profile and cluster beside {path}: {err}")
            e.recorder.save(path, meta=meta)
    engine.save_trace = save
    atexit.register(save)


def _save_plan_inputs(engine: Engine, path: Path) -> dict[str, str]:
    """On the rank that plans (0): the profile and the cluster its last plans were made from,
    beside the trace (`<trace>.profile.json`, `<trace>.cluster.json`), so that `caramel plan
    --profile ... --cluster ...` makes the same plan offline (with the same planner, options and
    overlap). Online, both are measured inside the job (the ready times under the host's load,
    the link as the profiling steps' collectives found it), so no later run sees them again.
    Their file names, for the trace's meta; none on the other ranks or before a plan."""
    c = engine.controller
    if c is None or c.rank != 0 or c.profile is None or c.plan_cluster is None:
        return {}
    names = {}
    for kind, obj in (("profile", c.profile), ("cluster", c.plan_cluster)):
        out = path.with_name(f"{path.stem}.{kind}.json")
        obj.save(out)
        names[f"planned_from_{kind}"] = out.name
    return names
