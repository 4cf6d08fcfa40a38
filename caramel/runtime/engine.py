"""The engine: executes a Plan on a process group, inside the user's own training loop.

Order of events in one step with `overlap="forward"`:
1. backward: each parameter's gradient hook copies its gradient into its bucket; a bucket whose
   gradients are all in is *ready*; the dispatcher (`caramel.runtime.dispatch`) issues the
   plan's items in its global order as soon as they are ready;
2. end of backward (autograd callback): parameters that got no gradient are filled in, all
   remaining items are issued;
3. `optimizer.step()`: returns at once, remembering the hyper-parameters of this step;
4. next forward: before a module runs, each bucket holding a parameter it uses is waited for
   and the user's optimizer is applied to that bucket's parameters only.
`overlap="backward"` applies everything at `step()`; `"none"` issues every collective when
backward ends and waits for them right there (no overlap at all: the reference point).

A controller (the strategy's planning logic) drives the engine only through its methods:
`set_plan`, `set_mode`, `start_measuring`/`stop_measuring`, `add_listeners`, `delegate_to`/
`take_back`, `mute`; the engine calls back `controller.on_step_end()` after every step. Those
it sets, and the plan switch, are in `caramel.runtime.control` (`EngineControl`, a mixin).

Delegation to torch DDP and the caller's access to the reduced gradients (clipping, closures)
are in `caramel.runtime.reduced` (`EngineReduced`, a mixin like `EngineHooks`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.plan.plan import OVERLAPS, Plan
from caramel.runtime.apply import apply_buckets, snapshot_hparams
from caramel.runtime.branch_forward import BranchForward
from caramel.runtime.control import EngineControl
from caramel.runtime.buckets import FlatBucket
from caramel.runtime.compression import Compressor
from caramel.runtime.dispatch import RELEASED, Dispatcher
from caramel.runtime.hooks import EngineHooks
from caramel.runtime.reduced import EngineReduced
from caramel.runtime.stats import EngineStats, plan_summary
from caramel.runtime.tied import RowExchange
from caramel.trace.recorder import Recorder

__all__ = ["RELEASED", "Controller", "Engine", "EngineStats"]


class Controller(Protocol):
    """What the engine needs of the strategy that drives it."""

    def on_step_end(self) -> None:
        """After every `optimizer.step()` that reduced (or while delegating): checks, trials, re-plans."""

    def settled(self) -> bool:
        """The schedule in force is final (no profiling or trial running)."""


class Engine(EngineControl, EngineHooks, EngineReduced):
    """Buckets, hooks, dispatcher and lazy optimizer application for one model and optimizer."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
                 names: list[str], comm_group: Any, world_size: int, rank: int, overlap: str,
                 recorder: Recorder, timeout_s: float, comm_priority: Any = None):
        assert overlap in OVERLAPS
        self.module, self.optimizer, self.params, self.names = module, optimizer, params, names
        self.world_size, self.rank = world_size, rank
        self.recorder = recorder
        self.timeout_s = timeout_s
        self.comm_priority = comm_priority  # the CommPriority its communication threads got (None: one process)
        self.stats = EngineStats()
        self.plan: Plan | None = None
        self.buckets: list[FlatBucket] = []
        self.bucket_of: dict[int, int] = {}
        self.require_sync = True  # False inside no_sync()
        self.delegating = False  # gradients go through self.ddp; the engine's hooks stand aside
        self.ddp: nn.Module | None = None  # torch DDP around the module, made on the first delegation
        self.step_calls = 0  # every optimizer.step(), with or without a reduction (checked across ranks)
        self.trace_path: Path | None = None
        self.row_exchanges: list[RowExchange] = []  # tied embeddings whose rows travel apart (split_tied)
        # One process: nothing to reduce and nothing to overlap, so the user's optimizer runs
        # at step() on the gradients where backward left them (no bucket copies).
        self.passthrough = world_size == 1
        self._overlap = overlap
        self._sync_apply = True  # apply at step() (profiling phase, or a plan-less fallback)
        # codec state (error feedback) per parameter, kept across plans and in checkpoints
        self.compressor = Compressor(params, names, world_size)
        self.grad_scale: float | None = None  # this rank's gradient weight; None: 1 / world size
        # called with a bucket id once its reduction is complete, before any update reads it
        # (balance="dropout" rescales the units only some ranks computed); None: nothing
        self.reduce_fixup: Callable[[int], None] | None = None
        self._dispatcher = Dispatcher(comm_group, recorder, self.compressor)
        self._controller: Controller | None = None
        self._on_grad_ready: list[Callable[[int], None]] = []
        self._on_backward_end: list[Callable[[], None]] = []
        self._trace_writer: Callable[[], None] | None = None
        self._group_holders: list = []  # other objects holding a private group (`.pg`), released with it
        self._release_handles: list = []  # hooks others put on the module, removed with the engine's
        self._ddp_group = None  # a process group made for that DDP (released with the engine), or None
        self.delegated_wait_s: Callable[[], float] | None = None  # while delegating: a step's timed wait
        self._callback_queued = False
        self._reduced = False  # a reduction happened since the last step()
        self._pending_apply: set[int] = set()
        self._hparams: list[dict[str, Any]] | None = None
        self._group_subsets: dict[int, list[list[nn.Parameter]]] = {}
        self._module_buckets: dict[str, list[int]] = {}
        self._hook_handles: list = []
        self._grad_handles: list = []
        self._step_t0: float | None = None
        self._wait_acc = 0.0
        self._fwd_t0 = 0.0
        self._order_changed = False
        self._last_pos = -1
        self._module_pos: dict[str, int] = {}
        self._param_index = {id(q): i for i, q in enumerate(params)}
        self._rows_of_bucket: dict[int, list[RowExchange]] = {}
        self._split = None  # SplitBackward of the plan's compute schedule (hooks.set_compute_schedule)
        self._handovers_before = 0  # early hand-overs of the SplitBackwards replaced since
        self._split_names: list = []
        self._early_names: list = []  # (name, module) of the early weight gradients in force
        self._early_wanted: list[str] = []
        # the dense layers filling the plan's first collective compute their weight gradient
        # before their input gradient, so that collective starts sooner (`set_plan`)
        self.early_weight_grads = True
        self.branch_forward = BranchForward(module)  # the plan's branch order (traced on first use)
        if not self.passthrough:
            self._install_grad_hooks()

    # ---------------------------------------------------------------- what the controller reads

    @property
    def overlap(self) -> str:
        return self._overlap

    @property
    def sync_apply(self) -> bool:
        return self._sync_apply

    @property
    def comm(self) -> Any:
        """The group the gradient collectives run on (None once released)."""
        return self._dispatcher.comm

    @property
    def controller(self) -> Controller | None:
        return self._controller

    @property
    def ddp_group(self) -> Any:
        return self._ddp_group

    @property
    def wait_this_step_s(self) -> float:
        """Time blocked on communication since the last `step()` that reduced (or passed through)."""
        return self._wait_acc

    def count_wait(self, seconds: float) -> None:
        """Add time blocked on a collective outside the gradient buckets (the buffer broadcast)."""
        self._wait_acc += seconds

    def has_pending_updates(self) -> bool:
        return bool(self._pending_apply)

    # ---------------------------------------------------------------- waiting and applying

    def _wait(self, bucket_ids: list[int]) -> None:
        """Block until these buckets' collectives are done; one wait event per bucket, back to back."""
        t_start = tb0 = self.recorder.now()
        for b in bucket_ids:
            fb = self.buckets[b]
            waited = False
            for c, work in enumerate(fb.works):
                if work is None:
                    continue
                waited = True
                try:
                    work.wait()
                except Exception as e:  # noqa: BLE001 - re-raised with context
                    raise RuntimeError(
                        f"caramel: rank {self.rank}: all-reduce of bucket {b} chunk {c} (step {self.stats.step}) "
                        f"failed: {e}. A peer may have died or hung (timeout {self.timeout_s:g} s)") from e
                fb.works[c] = None
                if self.recorder.enabled:
                    issue, done = self._dispatcher.pop_times((b, c), tb0)
                    self.recorder.record("comm", "comm", f"allreduce:b{b}c{c}", issue, done or self.recorder.now(),
                                         bucket=b, chunk=c, nbytes=fb.chunks[c].numel() * fb.flat.element_size())
            if waited and self.reduce_fixup is not None:
                self.reduce_fixup(b)
            for ex in self._rows_of_bucket.get(b, ()):
                if ex.pending():
                    # after the bucket's all-reduce, which overwrites the view: add every rank's rows
                    j = fb.local_slot[ex.tied.index]
                    if ex.finish(fb.grad_view(j)):
                        fb.flags[j] = 1.0
            tb1 = self.recorder.now()
            self.recorder.record("wait", "wait", f"wait:b{b}", tb0, tb1, bucket=b)
            tb0 = tb1
        self._wait_acc += tb0 - t_start

    def _reduced_already(self, b: int) -> bool:
        """Every collective of bucket b has completed (waiting for it would not block)."""
        return all(w is None or w.is_completed() for w in self.buckets[b].works)

    def _wait_apply(self, bucket_ids: list[int]) -> None:
        self._wait(bucket_ids)
        self._apply(bucket_ids)

    def _apply(self, bucket_ids: list[int]) -> None:
        t0 = self.recorder.now()
        apply_buckets(self.optimizer, self.buckets, self._group_subsets, bucket_ids, self._hparams)
        for b in bucket_ids:
            self._pending_apply.discard(b)
        if self.recorder.enabled:
            name = "apply:b" + ",".join(str(b) for b in bucket_ids) if len(bucket_ids) < 4 else "apply:all"
            self.recorder.record("compute", "optimizer", name, t0, self.recorder.now(),
                                 bucket=bucket_ids[0] if len(bucket_ids) == 1 else None)

    # ---------------------------------------------------------------- step / sync

    def step(self) -> bool:
        """The user's `optimizer.step()`. Returns False when no reduction happened (local step)."""
        if self.comm is None:
            raise CaramelError(RELEASED)
        self.step_calls += 1
        if self.passthrough:
            self._end_iteration()
            return False
        if self.delegating:
            # DDP's backward left averaged gradients in p.grad; the user's optimizer applies them
            # right after this returns, and the controller's checks run first as in any step
            if self.delegated_wait_s is not None:
                self._wait_acc += self.delegated_wait_s()
            self._end_iteration()
            if self._controller is not None:
                self._controller.on_step_end()
            return False
        if not self._reduced:
            return False
        self._reduced = False
        self._hparams = snapshot_hparams(self.optimizer)
        if self._overlap != "forward" or self._sync_apply:
            self.synchronize(all_at_once=True)
        self._end_iteration()
        if self._controller is not None:
            self._controller.on_step_end()
        return True

    def _end_iteration(self) -> None:
        now = self.recorder.now()
        self.stats.step += 1
        self.stats.last_wait_s = self._wait_acc
        self.stats.total_wait_s += self._wait_acc
        # the step period: from the previous step() to this one (forward, backward, waits, data)
        if self._step_t0 is not None:
            self.stats.last_step_s = now - self._step_t0
        self._wait_acc = 0.0
        self._step_t0 = now
        self.recorder.next_iteration()

    def synchronize(self, all_at_once: bool = False) -> None:
        """Wait for every outstanding collective and apply every pending update."""
        if self._callback_queued:
            raise CaramelError("synchronize() called during backward")
        if not self._pending_apply:
            return
        todo = sorted(self._pending_apply)
        self._wait(todo)
        if all_at_once:
            self._apply(todo)
        else:
            for b in todo:
                self._apply([b])

    def release(self) -> None:
        """Finish what is in flight (pending updates applied where possible), then drop the private
        communication groups, so that their threads are joined now and not during interpreter
        teardown (idempotent)."""
        if self.comm is None:
            return
        try:
            if not self._callback_queued:
                self.synchronize()
        except Exception:  # noqa: BLE001 - a dead peer at exit: nothing left to save
            pass
        for fb in self.buckets:
            for c, work in enumerate(fb.works):
                if work is not None:
                    try:
                        work.wait()
                    except Exception:  # noqa: BLE001 - same
                        pass
                    fb.works[c] = None
        self._dispatcher.comm = None
        self.delegating, self.ddp = False, None  # a later step is an error here too, not DDP quietly
        for holder in self._group_holders:
            if hasattr(holder, "drain"):
                holder.drain()
            holder.pg = None
        if self._ddp_group is not None:
            group, self._ddp_group = self._ddp_group, None
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 - the job's default group may be gone already at exit
                pass
        # the module as it was (hooks, split and narrow forwards gone), as the other strategies
        # leave theirs: parallelizing it again starts clean; the wrapper and the optimizer refuse
        if not self._callback_queued:
            self.remove_hooks()
            for h in self._release_handles:
                h.remove()
            self._release_handles = []
            if self._controller is not None and hasattr(self._controller, "detach"):
                self._controller.detach()

    def remove_hooks(self) -> None:
        self._early_wanted = []
        self.set_compute_schedule([])
        self.branch_forward.restore()
        for h in self._hook_handles + self._grad_handles:
            h.remove()
        for ex in self.row_exchanges:
            ex.tied.remove()
        self._hook_handles, self._grad_handles = [], []

    def bytes_per_step(self) -> int:
        return sum(fb.flat.numel() * fb.flat.element_size() for fb in self.buckets)

    def stats_dict(self) -> dict[str, Any]:
        """Numbers for progress bars and logs."""
        s = self.stats
        return {
            "step": s.step, "last_wait_s": s.last_wait_s, "last_step_s": s.last_step_s,
            "total_wait_s": s.total_wait_s, "replans": s.replans,
            "bytes_per_step": self.bytes_per_step(), "planner": self.plan.planner if self.plan else None,
            "plan_fingerprint": self.plan.fingerprint if self.plan else None, "overlap": self._overlap,
            "buckets": len(self.buckets), "items": len(self.plan.order) if self.plan else 0,
            "overlap_trial": s.extra.get("overlap_trial"), "delegated_to_ddp": self.delegating,
            "plan": plan_summary(self.plan),
            "comm_priority": self.comm_priority.to_dict() if self.comm_priority is not None else None,
        }
