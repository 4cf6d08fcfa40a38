"""The engine as its controller drives it: modes, listeners, measuring, and the switch to a plan.

A mixin of `caramel.runtime.engine.Engine`, apart only to keep each file to one concern: these
methods set the engine's state (buckets, dispatcher, hooks, module order), whose meaning the
engine's module docstring gives. `set_plan` is the plan switch: the plan's buckets, the order the
dispatcher issues their items in, the modules whose forward waits for each bucket, and the
compute schedule, all rebuilt from the plan and the profiled module uses.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from caramel.plan.plan import OVERLAPS, Plan
from caramel.runtime.apply import group_subsets
from caramel.runtime.buckets import FlatBucket

if TYPE_CHECKING:
    from caramel.runtime.engine import Controller


class EngineControl:
    """What a controller sets on the engine, and `set_plan` (see the module docstring)."""

    # ---------------------------------------------------------------- what the controller sets

    def attach(self, controller: Controller) -> None:
        """The controller called after every step (`Controller.on_step_end`)."""
        self._controller = controller

    def set_mode(self, overlap: str, sync_apply: bool) -> None:
        """Where updates are applied: `overlap` is the plan's mode, `sync_apply` forces every
        update to `step()` whatever the mode (profiling, or module uses not yet known)."""
        assert overlap in OVERLAPS
        self._overlap, self._sync_apply = overlap, sync_apply

    def set_grad_scale(self, scale: float | None) -> None:
        """Weight this rank's gradients by `scale` in the sum the ranks reduce (None: 1 / world
        size, the mean over equal batches). Unequal batches: local batch / global batch, so the
        sum is the global batch's mean gradient. Takes effect with the next bucket sealed."""
        self.grad_scale = scale
        for fb in self.buckets:
            fb.scale = 1.0 / self.world_size if scale is None else scale

    def start_measuring(self) -> None:
        """Time the gradient collectives (for `measured_bandwidth_bps`) until `stop_measuring`."""
        self._dispatcher.start_measuring()

    def stop_measuring(self) -> None:
        self._dispatcher.stop_measuring()

    def measured_bandwidth_bps(self, latency_s: float, queued_latency_s: float | None = None,
                               clear: bool = True) -> float | None:
        """Link bandwidth the measured collectives imply (`caramel.runtime.stats.bandwidth_from_log`)."""
        return self._dispatcher.measured_bandwidth_bps(self.world_size, latency_s, queued_latency_s, clear)

    def measured_log(self) -> list[tuple[float, float, int]]:
        """The collectives timed since measuring started: (issue, done, bytes), `perf_counter` s."""
        return list(self._dispatcher.log)

    def carry_measured_log(self, entries: list[tuple[float, float, int]]) -> None:
        """Put another process's timed collectives (a checkpoint's) before this one's own: shifted
        to end an hour ago, so no transfer of theirs seems to queue behind or before one of ours
        (`bandwidth_from_log` pairs each with its predecessor by completion time)."""
        if not entries:
            return
        shift = time.perf_counter() - 3600.0 - max(done for _, done, _ in entries)
        log = self._dispatcher.log
        own = list(log)
        log.clear()
        log.extend((float(i) + shift, float(d) + shift, int(n)) for i, d, n in entries)
        log.extend(own)

    def add_listeners(self, grad_ready: Callable[[int], None] | None = None,
                      backward_end: Callable[[], None] | None = None,
                      rows_ready: Callable[[int], None] | None = None) -> None:
        """Profiling callbacks: a parameter's gradient is in, backward ended, a tied embedding's rows are in."""
        if grad_ready is not None:
            self._on_grad_ready.append(grad_ready)
        if backward_end is not None:
            self._on_backward_end.append(backward_end)
        if rows_ready is not None:
            for ex in self.row_exchanges:
                ex.tied.on_rows_ready = rows_ready

    def remove_listeners(self, grad_ready: Callable[[int], None] | None = None,
                         backward_end: Callable[[], None] | None = None, rows_ready: bool = False) -> None:
        if grad_ready is not None:
            self._on_grad_ready.remove(grad_ready)
        if backward_end is not None:
            self._on_backward_end.remove(backward_end)
        if rows_ready:
            for ex in self.row_exchanges:
                ex.tied.on_rows_ready = None

    def take_order_changed(self) -> bool:
        """Whether modules ran out of the planned order since the last call (or plan), and forget it."""
        changed, self._order_changed = self._order_changed, False
        return changed

    def hold_group(self, holder: Any) -> None:
        """`holder.pg` is a private group released (after `holder.drain()`, if any) with the engine's."""
        self._group_holders.append(holder)

    def remove_at_release(self, *handles: Any) -> None:
        """Hook handles (on the user's module) removed when the engine is released."""
        self._release_handles.extend(handles)

    def mute(self, stand_in: Any) -> None:
        """Every gradient and row collective from now on goes to `stand_in` (a no-op group);
        pending ones finish first. For headroom analysis only."""
        self.synchronize()
        self._dispatcher.comm = stand_in
        for ex in self.row_exchanges:
            ex.pg = stand_in

    def set_trace_writer(self, path: Path, write: Callable[[], None]) -> None:
        """`write()` saves the trace to `path`; run at every `optimizer.synchronize()` and at exit."""
        self.trace_path, self._trace_writer = path, write

    def write_trace(self) -> None:
        if self._trace_writer is not None:
            self._trace_writer()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, with no communication."""
        old = self.require_sync
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = old

    # ---------------------------------------------------------------- plan

    def set_plan(self, plan: Plan, module_uses: dict[str, list[int]] | None,
                 module_order: list[str] | None = None) -> None:
        """Switch to `plan` (every pending update must already be applied).

        `module_uses` maps a module name to the parameter indices it uses (from profiling);
        forward pre-hooks go on those modules and on each parameter's owner module.
        `module_order` is the profiled forward order, against which a changed order is noticed.
        """
        assert not self._pending_apply and not self._callback_queued
        self.plan = plan
        self.recorder.instant("wait", "sync", f"plan:{plan.fingerprint}")
        self.buckets = [FlatBucket(b, [self.params[i] for i in b.params], self.world_size) for b in plan.buckets]
        if self.grad_scale is not None:
            for fb in self.buckets:
                fb.scale = self.grad_scale
        self.bucket_of = {i: b.id for b in plan.buckets for i in b.params}
        self._map_rows()
        self._dispatcher.reset(plan.order, plan.compression)
        self._group_subsets = group_subsets(self.optimizer, self.buckets)
        uses: dict[str, set[int]] = {}
        for name, m in self.module.named_modules():
            for p in m.parameters(recurse=False):
                idx = self._param_index.get(id(p))
                if idx is not None:
                    uses.setdefault(name, set()).add(idx)
        for name, idxs in (module_uses or {}).items():
            uses.setdefault(name, set()).update(idxs)
        # a plan with its own module order runs the model's branches in it (`branch_forward`)
        self.branch_forward.apply(plan.module_order)
        self._module_pos = {name: k for k, name in enumerate(plan.module_order or module_order or [])}
        self._order_changed = False
        self._module_buckets = {}
        for name, idxs in uses.items():
            bs = sorted({self.bucket_of[i] for i in idxs if i in self.bucket_of})
            if bs:
                self._module_buckets[name] = bs
        self.install_forward_hooks()
        schedule = getattr(plan, "compute_schedule", None)
        # only with the profiled module uses: a weight read outside its module's call must be known
        first = (set(plan.buckets[plan.order[0][0]].params)
                 if plan.order and self.early_weight_grads and module_uses is not None else set())
        self._early_wanted = self.early_candidates(uses, first) if first else []
        self.set_compute_schedule(list(schedule.modules) if schedule is not None else [])

    def module_order(self) -> list[str]:
        """The forward's module order the plan in force runs against (`set_plan`'s)."""
        return sorted(self._module_pos, key=self._module_pos.__getitem__)
