"""The controller: which plan the engine runs, and when that changes.

It adopts a plan (checked for this model and job, the same on every rank), or starts an overlap
trial of several (`trial`), and settles once profiling and any trial are over. The concerns it
coordinates live beside it: online profiling (`profiling`), the periodic checks and re-plans
(`checks`), the hand-over to torch DDP (`handover`). It drives the engine only through the
engine's methods and is called back after every step (`on_step_end`). Every decision is made
at the same step on every rank, from numbers every rank holds alike.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError, MismatchError
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.profile.profiler import UseTracker
from caramel.runtime.comm_priority import CommPriority
from caramel.runtime.dispatch import LocalGroup
from caramel.runtime.engine import Engine
from caramel.strategies.caramel import trial_shares
from caramel.strategies.caramel.adaptive_compression import compress_plan, with_codecs
from caramel.strategies.caramel.balance_state import balancer_state, load_balancer_state
from caramel.strategies.caramel.checks import PeriodicCheck, bandwidth_replan_cluster, check_same_plan
from caramel.strategies.caramel.handover import Handover
from caramel.strategies.caramel.plan_state import KEY as PLAN_KEY, LEGACY_AUTO_KEY, plan_state, restore_plan
from caramel.strategies.caramel.profiling import (OnlineProfiler, default_cluster, measured_cluster, module_uses,
                                                  profiling_step_end, registration_profile)
from caramel.strategies.caramel.profiling_state import KEY as PROFILING_KEY, profiling_state, restore_profiling
from caramel.strategies.caramel.trial import AUTO_CANDIDATES, DDP_SCHEDULE, Candidate, OverlapTrial, trial_preference
from caramel.strategies.caramel.trial_state import KEY as TRIAL_KEY, restore_trial, trial_state
from caramel.strategies.planners import make_plan
from caramel.strategies.rank_failure import Failed, global_ranks, raise_failed, run_local
from caramel.topology.spec import ClusterSpec


class Controller:
    """Planning for one engine: adopt, trial, online profiling, periodic checks (module docstring)."""

    def __init__(self, engine: Engine, model: nn.Module, names: list[str], params: list[nn.Parameter], group,
                 rank: int, world: int, planner: str, cluster: ClusterSpec | None, planner_options: dict,
                 fingerprint: str, lazy_ok: bool, profile_steps: int, check_every: int, replan: str = "off",
                 trial_steps: int = 0, broadcast_buffers: bool = True, trial_passes: int = 1,
                 find_unused_parameters: bool = True, comm_priority: CommPriority | None = None,
                 compression: str = "none", plan_inputs: dict[str, Any] | None = None):
        self.engine, self.model, self.names, self.params = engine, model, names, params
        self.group, self.rank, self.world = group, rank, world
        self.planner, self.cluster, self.planner_options = planner, cluster, planner_options
        self.fingerprint, self.lazy_ok = fingerprint, lazy_ok
        self.profile_steps = profile_steps
        self.compression = compression
        self.plan_inputs = plan_inputs or {}  # what a plan is made from, compared when a checkpoint's is adopted
        self.balancer = None  # a `balance.Balancer` with balance="batch" (set by parallelize)
        # whether the step now running enters the balancer's windows: not a profiling step, nor
        # one whose period holds a plan's adoption (the planning, a re-bucketing). Trial steps do:
        # they train at full speed, and a trial can outlast a short run, so that a slow worker
        # would wait for its share until the trial ends
        self._adoptions = 0  # plans adopted so far
        # ... as the last step end began (its balancing and planning are in the next step's
        # period); None before the first: a plan adopted before it (a checkpoint's) is in no
        # step's period, the process's first has none
        self._adoptions_at_end: int | None = None
        # auto compression follows the link: the bandwidth checks of replan="auto" run with it
        self.checks = PeriodicCheck(engine, group, rank, world, check_every, "auto" if compression == "auto" else replan)
        self.handover = Handover(engine, model, group, comm_priority or CommPriority("normal"), broadcast_buffers,
                                 find_unused_parameters)
        self.plan_cluster: ClusterSpec | None = None  # what the plan in force was made for
        self.profile: ModelProfile | None = None
        self.module_uses: dict[str, list[int]] | None = None
        self.profiler: OnlineProfiler | None = None
        self.hooks_installed = False
        self.uses_pending = False  # a plan without a profile: watching one forward for module uses
        self.use_tracker: UseTracker | None = None
        self.trial_steps = trial_steps  # > 0: overlap="auto", every new plan starts a trial
        self.trial_passes = trial_passes
        self.trial: OverlapTrial | None = None
        self.muted = False  # mute(): the schedule in force stays
        engine.attach(self)

    @property
    def profiling(self) -> bool:
        return self.profiler is not None

    def settled(self) -> bool:
        """True once profiling and any overlap trial are over: the schedule in force is the final one."""
        return not self.profiling and self.trial is None and not self.uses_pending

    # -- the plan in force
    def adopt(self, plan: Plan, source: str, overlap: str | None = None, module_order: list[str] | None = None) -> None:
        """Run `plan` (in `overlap`, else the mode in force) from the next step, on every rank;
        `module_order`: the forward's order when no profile gives it (a checkpoint's)."""
        overlap = overlap or self.engine.overlap
        self._adoptions += 1
        self.engine.synchronize()
        self.handover.take_back()
        plan.check_model(self.fingerprint, self.names, source=source)
        if plan.world_size != self.world:
            raise MismatchError(f"{source}: plan was made for {plan.world_size} workers, this job has {self.world}")
        check_same_plan(plan.fingerprint, self.group, self.world)
        order = [m.name for m in self.profile.modules] if self.profile is not None else module_order
        self.engine.set_plan(plan, self.module_uses, order)
        sync_apply = overlap != "forward" or not self.lazy_ok
        if self.module_uses is None and not sync_apply:
            # A plan without a profile says nothing about which module uses which parameter
            # (MultiheadAttention reads out_proj.weight without calling out_proj): apply at
            # step() until one forward has been watched, then switch to lazy updates.
            sync_apply = True
            self.uses_pending = True
            self._install_hooks()
        self.engine.set_mode(overlap, sync_apply)

    def trial_specs(self) -> list[tuple[str, str, str]]:
        """(name, planner, overlap) of every schedule a new profile is planned for: the one asked,
        or with overlap="auto" the planner's plan for each mode and DDP's schedule (fifo)."""
        if not self.trial_steps:
            return [(f"{self.planner}/{self.engine.overlap}", self.planner, self.engine.overlap)]
        specs = [(f"{self.planner}/{m}", self.planner, m) for m in AUTO_CANDIDATES]
        # torch DDP runs its buckets uncompressed: no candidate when every bucket must be compressed;
        # nor with "auto", which must keep timing its own collectives to see the link change (the
        # engine measures nothing while torch DDP runs); nor with balance="dropout", whose average
        # counts per entry the ranks that computed it. balance="batch" runs under DDP through
        # `ddp_shares.SharesHook` (share weights, timed waits)
        if (self.planner != "fifo" and self.compression == "none"
                and (self.balancer is None or self.balancer.runs_under_ddp)):
            specs.append((DDP_SCHEDULE, "fifo", "backward"))
        return specs

    @property
    def trial_sized(self) -> bool:
        """Whether a trial gets local batch sizes (balance="batch"; an option, alike on every rank)."""
        return trial_shares.sized_by(self.balancer)

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
                                  max_passes=self.trial_passes, predicted_s=predicted, sized=self.trial_sized)
        self.adopt_candidate(self.trial.current, source)

    def adopt_candidate(self, cand: Candidate, source: str, module_order: list[str] | None = None) -> None:
        """Run a trial's candidate from the next step; `module_order` as for `adopt`."""
        # adopt() first applies every pending update, whichever mode deferred it, and takes the
        # gradients back from torch DDP; DDP's schedule is then handed to torch DDP itself, in
        # the trial too, so the candidates are timed against what the user would otherwise run
        self.adopt(cand.plan, source=f"{source} ({cand.name})", overlap=cand.overlap, module_order=module_order)
        if cand.name == DDP_SCHEDULE:
            self.handover.hand_over()

    def plan_from_profile(self, profile: ModelProfile, cluster: ClusterSpec | None = None) -> None:
        """Rank 0 plans every candidate for `profile`; every rank receives them and adopts or tries them."""
        if profile.fingerprint() != self.fingerprint:
            raise MismatchError(f"profile of model {profile.model!r} does not match this model's parameters "
                                f"(profile has {len(profile.params)} parameters, model has {len(self.params)})")
        described: dict | Failed = {}
        if self.planner_options.get("branch_order") == "auto" and "branches" not in profile.meta and self.rank == 0:
            # the blocks the planner may reorder (a copy: a profile the user passed stays as it was)
            described = run_local(self.engine.branch_forward.describe, "could not describe its branches",
                                  alone=self.world == 1)
            if not isinstance(described, Failed):
                profile = dataclasses.replace(profile, meta={**profile.meta, **described})
        self.profile = profile
        self.module_uses = module_uses(profile)
        data = [None]
        cluster = cluster or self.cluster or default_cluster(self.world)
        self.plan_cluster = cluster
        specs = self.trial_specs()
        if self.rank == 0:
            # the user's planner options are for the user's planner; DDP's schedule keeps its defaults;
            # a planner that raises is carried to the ranks waiting in the broadcast (`rank_failure`)
            def plans() -> list[dict]:
                return [self._compressed(name, make_plan(planner, profile, cluster, world_size=self.world, overlap=overlap,
                                                         **(self.planner_options if planner == self.planner else {})),
                                         profile, cluster, overlap).to_dict()
                        for name, planner, overlap in specs]
            data = [described if isinstance(described, Failed) else
                    run_local(plans, "could not plan the candidates", alone=self.world == 1)]
        if self.world > 1:
            mine, ranks = data[0], global_ranks(self.group, self.world)
            dist.broadcast_object_list(data, src=ranks[0] if ranks else 0, group=self.group)
            raise_failed("plan", {0: data[0]}, self.rank, mine, ranks)
        cands = [Candidate(name, overlap, Plan.from_dict(d, source="plan from rank 0"))
                 for (name, _, overlap), d in zip(specs, data[0])]
        self.adopt_or_try(cands, source="plan from rank 0")

    def _compressed(self, name: str, plan: Plan, profile: ModelProfile, cluster: ClusterSpec, overlap: str) -> Plan:
        """The candidate with the codecs the `compression` option asks for (rank 0, before the
        broadcast: auto's choice travels in the plan). DDP's schedule stays uncompressed."""
        if name == DDP_SCHEDULE:
            return plan
        return compress_plan(plan, self.compression, profile, cluster, overlap)

    # -- online profiling inside the user's first steps
    def start_profiling(self) -> None:
        """A provisional DDP-like plan (reverse registration order) while the first steps are measured."""
        if not any(p.requires_grad for p in self.params):
            raise CaramelError("model has no trainable parameters (every parameter has requires_grad=False)")
        plan = make_plan("fifo", registration_profile(self.names, self.params), world_size=self.world)
        if self.compression not in ("none", "auto"):  # a fixed codec runs from the first step
            plan = with_codecs(plan, [self.compression] * len(plan.buckets))
        self.engine.synchronize()
        self.handover.take_back()
        # a trial still running (a changed module order seen by a periodic check mid-trial) ends
        # here: its candidates were planned from the old profile, and adopting one would replace
        # the provisional plan the profiling steps measure; the new plans start a new trial
        self.trial = None
        self.profile = None
        if self.profiler is not None:  # profiling again from the start
            self.profiler.detach()
            self.profiler.stop()
        # the planner may defer weight gradients unless told not to: time them in one more step
        split = self.planner_options.get("compute_schedule", "auto") != "off"
        self.profiler = OnlineProfiler(self.engine, self.model, self.params, self.rank, self.profile_steps,
                                       measure_split=split)
        self.engine.set_plan(plan, None)
        self.engine.set_mode(self.engine.overlap, sync_apply=True)
        self._install_hooks()

    def _install_hooks(self) -> None:
        if not self.hooks_installed:
            self._handles = [self.model.register_forward_pre_hook(self._fwd_pre),
                             self.model.register_forward_hook(self._fwd_post, always_call=True)]
            self.hooks_installed = True

    def detach(self) -> None:
        """Take this controller's hooks and the balancer's narrow forwards off the model (at
        `caramel.shutdown()`, after the engine's own)."""
        if self.profiler is not None:
            self.profiler.detach()
            self.profiler.stop()
            if self.profiler.timer is not None:
                self.profiler.timer.remove()
            self.profiler = None
        for h in getattr(self, "_handles", []):
            h.remove()
        self._handles, self.hooks_installed = [], False
        if self.balancer is not None and hasattr(self.balancer, "detach"):
            self.balancer.detach()

    def _fwd_pre(self, _m, _args):
        if self.uses_pending and self.use_tracker is None:
            self.use_tracker = UseTracker(self.model, self.params)
            self.use_tracker.__enter__()
            return
        if self.profiler is not None and torch.is_grad_enabled():
            self.profiler.forward_pre()

    def _fwd_post(self, _m, _args, _out):
        if self.use_tracker is not None and self.use_tracker._mode is not None:
            self.use_tracker.__exit__(None, None, None)
            self.use_tracker._mode = None
            return
        if self.profiler is not None:
            self.profiler.forward_post()

    # -- after every step
    def on_step_end(self) -> None:
        since = self._adoptions_at_end
        timed = since in (None, self._adoptions) and not self.profiling and not self.uses_pending
        self._adoptions_at_end = self._adoptions
        if self.balancer is not None:
            self.balancer.step_end(timed=timed)
        self._step_end_plans()

    def _step_end_plans(self) -> None:
        if self.uses_pending and self.use_tracker is not None and self.use_tracker._mode is None:
            uses: dict[str, list[int]] = {}
            for idx, mods in self.use_tracker.use_modules.items():
                for m in mods:
                    uses.setdefault(m, []).append(idx)
            self.module_uses = uses
            self.uses_pending = False
            self.engine.set_plan(self.engine.plan, uses, self.use_tracker.module_order)
            self.engine.set_mode(self.engine.overlap, self.engine.overlap != "forward" or not self.lazy_ok)
            self.use_tracker = None
        if self.trial is not None:
            self._trial_step_end()
        if self.profiler is not None:
            self._profiling_step_end()
        elif self.checks.due(self.engine.stats.step):
            self._periodic_check()

    def _trial_step_end(self) -> None:
        # the balancer's count when there is one: restored on every resume, where the engine's
        # restarts at 0 unless a plan, trial or profiling entry is carried on; so a share
        # change's `step` and the trial's blocks are counted alike
        step = self.balancer.step if self.balancer is not None else self.engine.stats.step
        # this rank's share of the step (balance="batch"): the trial compares candidates on steps
        # run at the same shares (`OverlapTrial._at_latest_shares`)
        n = getattr(self.balancer, "local_batch", None)
        nxt = self.trial.record(self.engine.stats.last_step_s, step=step, n=n)
        if nxt is None:
            return
        if self.trial.result is not None:
            self.engine.stats.note(overlap_trial=self.trial.result)
            self.trial = None
        # the same candidate again (the winner ran last, or a new pass starts with it): no switch
        if not (nxt.plan is self.engine.plan and nxt.overlap == self.engine.overlap):
            self.adopt_candidate(nxt, source="overlap trial")

    def _profiling_step_end(self) -> None:
        profiler, self.profiler = self.profiler, None  # stays None if the build raised: none to step again
        profile = profiling_step_end(profiler, self.group, self.world, self.rank)
        if profile is None:
            self.profiler = profiler  # more profiling steps to come
            return
        # measured while the profiling steps' collectives are still in the engine's log
        cluster = None if self.cluster is not None else measured_cluster(self.engine, self.group, self.world)
        profiler.stop()
        self.plan_from_profile(profile, cluster)
        self.engine.stats.count_replan()

    def _periodic_check(self) -> None:
        verdict = self.checks.agree(self.plan_cluster)
        if verdict.order_changed:
            self.engine.stats.count("order_changes")
            if not self.muted and self.checks.may_reprofile():
                self.start_profiling()
                return
        if verdict.measured_bps and self.profile is not None and self.plan_cluster is not None and not self.muted:
            self._maybe_replan_bandwidth(verdict.measured_bps)

    def _maybe_replan_bandwidth(self, measured_bps: float) -> None:
        assumed = self.plan_cluster.bandwidth_bps
        self.engine.stats.note(measured_bandwidth_bps=measured_bps)
        cluster = bandwidth_replan_cluster(self.plan_cluster, measured_bps, self.engine.stats.step)
        if cluster is None:
            return
        self.plan_from_profile(self.profile, cluster)
        self.engine.stats.count_replan()
        self.engine.stats.log("bandwidth_replans", {"step": self.engine.stats.step, "assumed_bps": assumed,
                                                    "measured_bps": measured_bps, "plan": self.engine.plan.fingerprint})

    # -- checkpoints
    def adaptive_state(self) -> dict[str, Any]:
        """What a resumed run needs of this controller's adaptation; {} for none: the balancer's
        state (`balance_state`) and, once settled, the plan in force with what it was made from
        (`plan_state`), for every compression mode; while the engine profiles or an overlap
        trial runs, what they measured so far (`profiling_state`, `trial_state`)."""
        out: dict[str, Any] = {}
        if self.balancer is not None:
            out["balance"] = balancer_state(self.balancer, self.rank, self.world)
        plan = plan_state(self)
        if plan is not None:
            out[PLAN_KEY] = plan
        for key, entry in ((TRIAL_KEY, trial_state(self)), (PROFILING_KEY, profiling_state(self))):
            if entry is not None:
                out[key] = entry
        return out

    def load_adaptive_state(self, state: dict[str, Any]) -> None:
        """Restore `adaptive_state()` (every rank, the same `state`); balance state for a run
        with balance="off" is ignored (nothing adapts to it). A saved plan is adopted instead of
        profiling when it was made for this run's options (`plan_state.restore_plan`); profiling
        or a trial taken half-way is carried on alike (`profiling_state`, `trial_state`)."""
        if state.get("balance") is not None and self.balancer is not None:
            load_balancer_state(self.balancer, state["balance"], self.rank, self.world)
        if state.get(PLAN_KEY) is not None:
            restore_plan(self, state[PLAN_KEY])
        elif state.get(TRIAL_KEY) is not None:
            restore_trial(self, state[TRIAL_KEY])
        elif state.get(PROFILING_KEY) is not None:
            restore_profiling(self, state[PROFILING_KEY])
        elif state.get(LEGACY_AUTO_KEY) is not None:
            restore_plan(self, state[LEGACY_AUTO_KEY], legacy=True)

    # -- headroom analysis
    def mute(self) -> None:
        """Every gradient collective a no-op from now on (`mute_gradient_communication`)."""
        if self.profiling or self.trial is not None:
            # both time the collectives and choose from what they saw, and the trial may hand the
            # job to torch DDP, whose collectives no mute reaches
            raise CaramelError("mute_gradient_communication: the engine is still choosing its schedule "
                               f"({'online profiling' if self.profiling else 'overlap trial'}); "
                               "mute it once schedule_settled(optimizer) is True, or parallelize with a plan")
        if self.engine.delegating:
            raise CaramelError("mute_gradient_communication: this engine handed its schedule to torch DDP; "
                               "register torch's noop_hook on that DDP module instead")
        self.engine.mute(LocalGroup())
        self.muted = True  # no new profile or plan from muted collectives' timings

