"""The engine's hooks: gradient hooks fill buckets, forward pre-hooks apply pending updates.

A mixin of `caramel.runtime.engine.Engine`, apart only to keep each file to one concern: the
hooks read and write the engine's state (buckets, pending updates, the dispatcher), whose
meaning the engine's module docstring gives. Order within a step: gradient hooks during
backward (a full bucket is sealed and its items issued), `_finalize_backward` when autograd
ends (the rest filled in and issued, tied rows exchanged), then the next forward's pre-hooks
(each module waits for and applies the buckets it uses) and the root's post-hook (the rest).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.split_backward import SplitBackward, splittable
from caramel.profile.tied import TiedEmbedding
from caramel.runtime.buckets import FlatBucket
from caramel.runtime.tied import RowExchange


class EngineHooks:
    """Hook installation and the hooks themselves (see the module docstring)."""

    def split_tied(self, found: list[tuple[str, nn.Embedding, int]], pg: Any) -> None:
        """Send the embedding's part of each tied weight's gradient apart, as rows, over `pg` (a
        private group: `caramel.runtime.tied`). Its own gradient is then ready early in backward."""
        for name, emb, idx in found:
            tied = TiedEmbedding(name, emb, idx, self._splits_now)
            self.row_exchanges.append(RowExchange(tied, pg, self.world_size))
        self._group_holders.extend(self.row_exchanges)  # their `pg` is released with the engine's
        self._map_rows()

    def _map_rows(self) -> None:
        """Which bucket's reduced gradient each exchange's rows go into (after every new plan)."""
        self._rows_of_bucket = {}
        for ex in self.row_exchanges:
            if ex.tied.index in self.bucket_of:
                self._rows_of_bucket.setdefault(self.bucket_of[ex.tied.index], []).append(ex)

    def _splits_now(self) -> bool:
        """This forward's gradients go through the engine's buckets (so its rows can travel apart)."""
        return (not self.passthrough and not self.delegating and self.require_sync and self.plan is not None
                and self.comm is not None)

    def set_compute_schedule(self, modules: list[str], timed: bool = False) -> None:
        """Defer the weight gradients of `modules` (names in `self.module`, in the order their
        gradients are computed: `caramel.profile.split_backward`) in every forward whose
        gradients the engine reduces; [] restores autograd's order. Each deferred gradient fills
        its bucket the moment it exists, as a gradient hook would. `timed`: time each one
        (`deferred_timings`), for the online profile. The plan's early weight gradients
        (`Engine.set_plan`) stay, except for a module deferred here."""
        early = [n for n in self._early_wanted if n not in modules]
        current = [n for n, _ in self._split_names] if self._split is not None else []
        current_early = [n for n, _ in self._early_names] if self._split is not None else []
        if (modules == current and early == current_early
                and (self._split is None or self._split.time_modules == (timed or self.recorder.enabled))):
            return
        if self._split is not None:
            self._handovers_before += self._split.handovers
            self._split.remove()
            self._split = None
        self._split_names, self._early_names = [], []
        if modules or early:
            named = dict(self.module.named_modules())
            missing = [n for n in modules + early if n not in named]
            if missing:
                raise CaramelError(f"the plan splits the backward of {', '.join(missing)}, which this model "
                                   "does not have")
            self._split_names = [(n, named[n]) for n in modules]
            self._early_names = [(n, named[n]) for n in early]
            self._split = SplitBackward([named[n] for n in modules], on_ready=self._deferred_ready,
                                        on_keep=self._queue_finalize, time_modules=timed or self.recorder.enabled,
                                        early=[named[n] for n in early])
            self._split.install()

    @property
    def early_handovers(self) -> int:
        """Early weight gradients handed over inside backward so far, in total (read-only; a
        test's proof that the early path ran, since the fallback gives the same gradients)."""
        return self._handovers_before + (self._split.handovers if self._split is not None else 0)

    def early_candidates(self, uses: dict[str, set[int]], bucket_params: set[int]) -> list[str]:
        """The dense layers whose weight is in `bucket_params` and whose weight gradient can go
        early: splittable, and no other module uses the weight or bias through autograd (a tied
        output layer qualifies when its embedding's part travels apart as rows)."""
        users: dict[int, set[str]] = {}
        for name, idxs in uses.items():
            for i in idxs:
                users.setdefault(i, set()).add(name)
        apart = {ex.tied.name for ex in self.row_exchanges}
        named = dict(self.module.named_modules())
        out = []
        for name in sorted(uses):
            m = named.get(name)
            if m is None or isinstance(m, nn.Embedding) or not splittable(m):
                continue
            if self._param_index.get(id(m.weight)) not in bucket_params:
                continue
            own = [p for p in (m.weight, getattr(m, "bias", None)) if p is not None and p.requires_grad]
            if all(users.get(self._param_index.get(id(p)), set()) - {name} <= apart for p in own):
                out.append(name)
        return out

    def _deferred_ready(self, param: nn.Parameter) -> None:
        idx = self._param_index.get(id(param))
        if idx is not None and param.requires_grad:
            self._grad_hook(idx)(param)

    def _queue_finalize(self) -> None:
        """`_finalize_backward` runs when autograd ends this backward (queued once per backward)."""
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)

    def _run_deferred(self) -> None:
        """The deferred weight gradients, first layer first; each fills its bucket at once."""
        t0 = self.recorder.now()
        self._split_kept = {m: self._split.deferred_bytes(m, whole=True) for _, m in self._split_names}
        self._split.run()
        if self.recorder.enabled:
            # one event per module, laid end to end from the measured seconds: the plot marks them
            t = t0
            for name, m in self._split_names:
                dt = self._split.last_run_s.get(m)
                if dt is not None:
                    self.recorder.record("compute", "deferred", f"wgrad:{name}", t, t + dt)
                    t += dt

    def deferred_timings(self) -> tuple[dict[nn.Module, float], dict[nn.Module, int]]:
        """Seconds of each deferred weight gradient in the last backward, and the bytes each kept."""
        if self._split is None:
            return {}, {}
        return dict(self._split.last_run_s), dict(getattr(self, "_split_kept", {}))

    def _install_grad_hooks(self) -> None:
        for i, p in enumerate(self.params):
            if p.requires_grad:
                self._grad_handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))

    def install_forward_hooks(self) -> None:
        """The pre-hooks that apply each module's pending updates (and, with no plan, only the
        root's hooks, which record forward events for the trace)."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        named = dict(self.module.named_modules())
        for name, bs in self._module_buckets.items():
            if name in named and name != "":
                pos = self._module_pos.get(name)
                self._hook_handles.append(named[name].register_forward_pre_hook(self._make_pre_hook(bs, pos)))
        # The root: buckets its own forward uses, then the safety net at forward end.
        root_bs = self._module_buckets.get("", [])
        self._hook_handles.append(self.module.register_forward_pre_hook(self._root_pre_hook(root_bs)))
        self._hook_handles.append(self.module.register_forward_hook(self._root_post_hook, always_call=True))

    def _grad_hook(self, idx: int):
        def hook(p: torch.Tensor) -> None:
            if self.passthrough or self.delegating or not self.require_sync or self.plan is None:
                return
            self._queue_finalize()
            b = self.bucket_of.get(idx)
            if b is None:
                return
            fb = self.buckets[b]
            if b in self._pending_apply:
                self._wait_apply([b])
            j = fb.local_slot[idx]
            if fb.fired[j]:
                raise CaramelError(
                    f"parameter {self.names[idx]!r} received a gradient twice in one backward; to accumulate "
                    "gradients over several backward passes, run all but the last inside `with model.no_sync():`")
            fb.put(j, p.grad)
            for cb in self._on_grad_ready:
                cb(idx)
            if fb.pending == 0:
                self._mark_ready(fb)
        return hook

    def _make_pre_hook(self, bucket_ids: list[int], pos: int | None = None):
        def hook(_m, _args):
            if pos is not None:
                # modules running out of the profiled order: correct (each module applies what it
                # uses), but the plan's priorities no longer fit; the controller re-plans
                if pos < self._last_pos:
                    self._order_changed = True
                self._last_pos = max(self._last_pos, pos)
            if self._pending_apply:
                todo = [b for b in bucket_ids if b in self._pending_apply]
                if todo:
                    # buckets whose collectives are already done go along: one optimizer call
                    # instead of one each (each call has a fixed cost besides its arithmetic,
                    # docs/results/engine.md, "The engine's own cost"); applying an update
                    # before the first module that uses it is as exact as at it
                    done = [b for b in self._pending_apply if b not in todo and self._reduced_already(b)]
                    self._wait_apply(sorted(todo + done))
        return hook

    def _root_pre_hook(self, bucket_ids: list[int]):
        inner = self._make_pre_hook(bucket_ids)

        def hook(m, args):
            self._last_pos = -1
            self._fwd_t0 = self.recorder.now()
            if self._split is not None:
                self._split.set_recording(self._splits_now() and torch.is_grad_enabled())
            inner(m, args)
        return hook

    def _root_post_hook(self, _m, _args, _out) -> None:
        # Updates whose parameters this forward did not use are applied now, so the next
        # backward never overwrites a bucket that still holds unapplied gradients.
        if self._split is not None:
            self._split.set_recording(False)
        if self._pending_apply:
            self._wait_apply(sorted(self._pending_apply))
        self.recorder.record("compute", "forward", "forward", self._fwd_t0, self.recorder.now())
        self._bwd_t0 = self.recorder.now()

    def _mark_ready(self, fb: FlatBucket) -> None:
        fb.seal()
        fb.ready = True
        self.recorder.instant("comm", "ready", f"ready:b{fb.id}", bucket=fb.id)
        if self._overlap != "none":
            self._dispatcher.issue_ready(self.buckets)

    def _finalize_backward(self) -> None:
        """End of backward: the deferred weight gradients, then parameters without gradients
        filled in and everything left issued."""
        if self._split is not None and self._split.pending():
            self._run_deferred()
        for fb in self.buckets:
            if fb.ready:
                continue
            for j, done in enumerate(fb.fired):
                if not done:
                    fb.put(j, fb.params[j].grad)
            self._mark_ready(fb)
        self._dispatcher.issue_ready(self.buckets)
        assert self._dispatcher.all_issued()
        for ex in self.row_exchanges:
            ex.start()
        self.recorder.record("compute", "backward", "backward", getattr(self, "_bwd_t0", self._fwd_t0), self.recorder.now())
        self._dispatcher.reset(self.plan.order, self.plan.compression)
        for fb in self.buckets:
            fb.new_iteration()
        self._callback_queued = False
        self._reduced = True
        self._pending_apply = set(range(len(self.buckets)))
        for cb in self._on_backward_end:
            cb()
        if self._overlap == "none":
            self._wait(sorted(self._pending_apply))

