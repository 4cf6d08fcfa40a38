"""The per-model state of the `ps` strategy: `PsRun` owns the `PsEngine`, profiles the first
`PROFILE_STEPS` steps online, adopts the plan rank 0 makes from that profile, moves optimizer state
to it, and keeps the per-step log (TicTac's E and S, staleness) behind `stats_dict()`.

Kept apart from `parallelize.py`, which only checks the arguments, builds the process groups and
wraps the user's model and optimizer around a `PsRun`.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import group_alive
from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.profile.profiler import StepTimer, UseTracker, build_profile, unique_params
from caramel.runtime.buffer_sync import buffer_mode
from caramel.strategies.ps.buffer_sync import ps_buffer_sync
from caramel.strategies.ps.compensate import gather_mean_sq
from caramel.strategies.ps.engine import CMD_DONE, CMD_GATHER, CMD_PLAN, PsEngine
from caramel.strategies.ps.transfers import PsGroups
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.planner import DEFAULT_LATENCY_S, PsPlan, first_plan, kind_of, make_ps_plan
from caramel.strategies.ps.server import command, send_load, send_values
from caramel.strategies.ps.state import gather_full_state, keep_own_state, move_state
from caramel.strategies.ps.tictac import efficiency, steady_medians
from caramel.strategies.rank_failure import Failed, raise_failed, run_local
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
            entry["makespan_s"] = makespan
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
        profile: ModelProfile | Failed | None = None
        if self.rank == 0:  # one that raises is carried to the ranks waiting in the plan's broadcast
            profile = run_local(lambda: build_profile(type(self.module).__name__, 0, self.module, self.tracker,
                                                      self.timer.samples), "could not build the model profile",
                               alone=len(self.ranks) == 1)
        self.timer.remove()
        self.tracker = self.timer = None
        self._adopt_plan(profile)

    def _adopt_plan(self, profile: ModelProfile | Failed | None) -> None:
        """Rank 0 plans from `profile`; every rank takes the plan, moves optimizer state and hooks.
        A failure on rank 0 (building the profile: `profile` is `Failed`; planning) is what rank 0
        broadcasts, raised on every rank (and dedicated server) instead of leaving them waiting."""
        payload: list[Any] = [None]
        if self.rank == 0:
            payload = [profile if isinstance(profile, Failed) else
                       run_local(lambda: self._plan(profile), "could not plan", alone=len(self.ranks) == 1)]
        if self.groups.dedicated:
            self._tell_servers(CMD_PLAN)
        mine = payload[0]
        dist.broadcast_object_list(payload, src=self.ranks[0], group=self.groups.control)
        old = self.engine
        try:  # the last step's pulls drained first, as on success: a dedicated server waits for them
            old.synchronize()
        finally:  # rank 0 could not plan: raised on every rank (a failed drain's error as its context)
            raise_failed("ps plan", {0: payload[0]}, self.rank, mine, self.ranks)
        plan_d, waits = payload[0]
        plan = PsPlan.from_dict(plan_d)
        old.remove_hooks()
        e = PsEngine(self.module, self.optimizer, self.options, plan, self.groups, self.ranks, self.buffer_sync,
                     self.share_buffers)
        e.steps, e.version, e.wait_s, e.sent_hparams = old.steps, dict(old.version), old.wait_s, old.sent_hparams
        move_state(self.optimizer, self.params, old.server_ranks(), e.server_ranks(), self.rank, self.groups.control)
        e.applied = old.applied  # updates applied in the whole run (`stats_dict`)
        self._gathered_at = -1  # move_state kept only this rank's shards: state_dict() waits for synchronize()
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

    def _plan(self, profile: ModelProfile) -> tuple[dict, dict[str, list[int]]]:
        """Rank 0: the plan for `profile` (as a dict) and the parameters each module's forward waits for."""
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
        return plan.to_dict(), waits

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
        medians = steady_medians(self.log)
        return {"strategy": "ps", "order": plan.order, "consistency": self.options.consistency,
                "placement": plan.placement, "shards": plan.shards, "steps": e.steps,
                "buckets": len(plan.buckets), "bucket_cap_mb": self.options.bucket_cap_mb,
                "pull_buckets": len(plan.pull_buckets), "pull_bucket_cap_mb": self.options.pull_cap_mb(),
                # S over the same steps as E, and (m - U) / L = -E S, the makespan beyond U in units
                # of L, where E says nothing
                **{k: medians[k] for k in ("E_median", "S", "beyond_U_over_L_median")},
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
