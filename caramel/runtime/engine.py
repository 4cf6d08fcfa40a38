"""The engine: executes a Plan on a process group, inside the user's own training loop.

Order of events in one step with `overlap="forward"`:
1. backward: each parameter's gradient hook copies its gradient into its bucket; a bucket whose
   gradients are all in is *ready*; the dispatcher issues items of the plan's global order as
   soon as they are ready and everything before them has been issued (so every rank issues the
   same collectives in the same order, and the single-threaded backend sends them in that order);
2. end of backward (autograd callback): parameters that got no gradient are filled in, all
   remaining items are issued;
3. `optimizer.step()`: returns at once, remembering the hyper-parameters of this step;
4. next forward: before a module runs, each bucket holding a parameter it uses is waited for
   and the user's optimizer is applied to that bucket's parameters only.
`overlap="backward"` applies everything at `step()`; `"none"` issues every collective when
backward ends and waits for them right there (no overlap at all: the reference point).

Delegation: when an overlap trial keeps DDP's schedule, the controller hands the gradients to
torch's own `DistributedDataParallel` (`delegate_to`): its C++ reducer runs the same buckets with
less per-step cost than the engine's Python hooks, so such a job runs at DDP's speed. The
engine's hooks stand aside (`delegating`), `step()` lets the user's optimizer run on the
gradients DDP averaged into `p.grad`, and a re-plan takes the gradients back.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.plan.plan import OVERLAPS, Plan
from caramel.runtime.buckets import FlatBucket
from caramel.profile.tied import TiedEmbedding
from caramel.runtime.tied import RowExchange
from caramel.plan.costs import fixed_cost_s, hidden_transfer_s
from caramel.trace.recorder import Recorder

RELEASED = "caramel.shutdown() released this model's communication group; parallelize the model again to keep training"


@dataclass
class EngineStats:
    step: int = 0
    last_wait_s: float = 0.0
    last_step_s: float = 0.0
    total_wait_s: float = 0.0
    replans: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    """Buckets, hooks, dispatcher and lazy optimizer application for one model and optimizer."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
                 names: list[str], comm_group: Any, world_size: int, rank: int, overlap: str,
                 recorder: Recorder, timeout_s: float):
        assert overlap in OVERLAPS
        self.module = module
        self.optimizer = optimizer
        self.params = params
        self.names = names
        self.comm = comm_group
        self.world_size = world_size
        self.rank = rank
        self.overlap = overlap
        self.recorder = recorder
        self.timeout_s = timeout_s
        self.stats = EngineStats()
        self.plan: Plan | None = None
        self.buckets: list[FlatBucket] = []
        self.bucket_of: dict[int, int] = {}
        self.require_sync = True  # False inside no_sync()
        self.sync_apply = True  # apply at step() (profiling phase, or a plan-less fallback)
        self.on_backward_end: list = []  # callbacks (profiling)
        self.on_grad_ready: list = []
        self._callback_queued = False
        self._reduced = False  # a reduction happened since the last step()
        self._next_item = 0
        self._pending_apply: set[int] = set()
        self._hparams: list[dict[str, Any]] | None = None
        self._group_subsets: dict[int, list[list[nn.Parameter]]] = {}
        self._module_buckets: dict[str, list[int]] = {}
        self._hook_handles: list = []
        self._grad_handles: list = []
        self._step_t0: float | None = None
        self._wait_acc = 0.0
        self._comm_done: dict[tuple[int, int], float] = {}
        self._issue_t: dict[tuple[int, int], float] = {}
        self._fwd_t0 = 0.0
        self.on_step_end = None  # set by the planning controller
        self.measure_comm = recorder.enabled
        # One process: nothing to reduce and nothing to overlap, so the user's optimizer runs
        # at step() on the gradients where backward left them (no bucket copies).
        self.passthrough = world_size == 1
        self.comm_log: collections.deque = collections.deque(maxlen=100_000)
        self.order_changed = False
        self.step_calls = 0  # every optimizer.step(), with or without a reduction (checked across ranks)
        self._last_pos = -1
        self._module_pos: dict[str, int] = {}
        self.controller = None
        self.save_trace = None
        self.group_holders: list = []  # other objects holding a private group (`.pg`), released with it
        self.ddp: nn.Module | None = None  # torch DDP around the module, made on the first delegation
        self.ddp_group = None  # a process group made for that DDP (released with the engine), or None
        self.comm_priority = None  # the CommPriority its communication threads got (None: one process)
        self.delegating = False  # gradients go through self.ddp; the engine's hooks stand aside
        self.row_exchanges: list[RowExchange] = []  # tied embeddings whose rows travel apart (split_tied)
        self._rows_of_bucket: dict[int, list[RowExchange]] = {}
        if not self.passthrough:
            self._install_grad_hooks()

    def split_tied(self, found: list[tuple[str, nn.Embedding, int]], pg: Any) -> None:
        """Send the embedding's part of each tied weight's gradient apart, as rows, over `pg` (a
        private group: `caramel.runtime.tied`). Its own gradient is then ready early in backward."""
        for name, emb, idx in found:
            tied = TiedEmbedding(name, emb, idx, self._splits_now)
            self.row_exchanges.append(RowExchange(tied, pg, self.world_size))
        self.group_holders.extend(self.row_exchanges)  # their `pg` is released with the engine's
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

    # ---------------------------------------------------------------- plan

    def set_plan(self, plan: Plan, module_uses: dict[str, list[int]] | None,
                 module_order: list[str] | None = None) -> None:
        """Switch to `plan` (every pending update must already be applied).

        `module_uses` maps a module name to the parameter indices it uses (from profiling);
        forward pre-hooks go on those modules and on each parameter's owner module.
        """
        assert not self._pending_apply and not self._callback_queued
        self.plan = plan
        self.recorder.instant("wait", "sync", f"plan:{plan.fingerprint}")
        self.buckets = [FlatBucket(b, [self.params[i] for i in b.params], self.world_size) for b in plan.buckets]
        self.bucket_of = {i: b.id for b in plan.buckets for i in b.params}
        self._map_rows()
        self._next_item = 0
        groups = self.optimizer.param_groups
        self._group_subsets = {}
        for fb in self.buckets:
            ids = {id(p) for p in fb.params}
            self._group_subsets[fb.id] = [[p for p in g["params"] if id(p) in ids] for g in groups]
        uses: dict[str, set[int]] = {}
        for name, m in self.module.named_modules():
            for p in m.parameters(recurse=False):
                idx = self._index_of(p)
                if idx is not None:
                    uses.setdefault(name, set()).add(idx)
        for name, idxs in (module_uses or {}).items():
            uses.setdefault(name, set()).update(idxs)
        self._module_pos = {name: k for k, name in enumerate(module_order or [])}
        self._module_buckets = {}
        for name, idxs in uses.items():
            bs = sorted({self.bucket_of[i] for i in idxs if i in self.bucket_of})
            if bs:
                self._module_buckets[name] = bs
        self._install_forward_hooks()

    def _index_of(self, p: nn.Parameter) -> int | None:
        if not hasattr(self, "_param_index"):
            self._param_index = {id(q): i for i, q in enumerate(self.params)}
        return self._param_index.get(id(p))

    # ---------------------------------------------------------------- hooks

    def _install_grad_hooks(self) -> None:
        for i, p in enumerate(self.params):
            if p.requires_grad:
                self._grad_handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))

    def _install_forward_hooks(self) -> None:
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
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)
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
            for cb in self.on_grad_ready:
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
                    self.order_changed = True
                self._last_pos = max(self._last_pos, pos)
            if self._pending_apply:
                todo = [b for b in bucket_ids if b in self._pending_apply]
                if todo:
                    # buckets whose collectives are already done go along: one optimizer call
                    # instead of one each (each costs ~0.4 ms besides its arithmetic); applying
                    # an update before the first module that uses it is as exact as at it
                    done = [b for b in self._pending_apply if b not in todo and self._reduced_already(b)]
                    self._wait_apply(sorted(todo + done))
        return hook

    def _root_pre_hook(self, bucket_ids: list[int]):
        inner = self._make_pre_hook(bucket_ids)

        def hook(m, args):
            self._last_pos = -1
            self._fwd_t0 = self.recorder.now()
            inner(m, args)
        return hook

    def _root_post_hook(self, _m, _args, _out) -> None:
        # Updates whose parameters this forward did not use are applied now, so the next
        # backward never overwrites a bucket that still holds unapplied gradients.
        if self._pending_apply:
            self._wait_apply(sorted(self._pending_apply))
        self.recorder.record("compute", "forward", "forward", self._fwd_t0, self.recorder.now())
        self._bwd_t0 = self.recorder.now()

    # ---------------------------------------------------------------- dispatch

    def _mark_ready(self, fb: FlatBucket) -> None:
        fb.seal()
        fb.ready = True
        self.recorder.instant("comm", "ready", f"ready:b{fb.id}", bucket=fb.id)
        if self.overlap != "none":
            self._dispatch()

    def _dispatch(self) -> None:
        order = self.plan.order
        while self._next_item < len(order):
            b, c = order[self._next_item]
            fb = self.buckets[b]
            if not fb.ready:
                return
            t = self.recorder.now()
            if self.measure_comm:
                self._issue_t[(b, c)] = t
            if self.comm is None:
                raise CaramelError(RELEASED)
            work = self.comm.allreduce([fb.chunks[c]])
            fb.works[c] = work
            if self.measure_comm:
                self.recorder.instant("comm", "issue", f"issue:b{b}c{c}", at=t, bucket=b, chunk=c)
                nbytes = fb.chunks[c].numel() * fb.flat.element_size()
                work.get_future().add_done_callback(lambda _f, key=(b, c), n=nbytes: self._on_comm_done(key, n))
            self._next_item += 1

    def _on_comm_done(self, key: tuple[int, int], nbytes: int) -> None:
        # runs on the backend's thread: only appends (atomic under the GIL)
        now = time.perf_counter()
        self._comm_done[key] = now
        self.comm_log.append((self._issue_t.get(key, now), now, nbytes))

    def measured_bandwidth_bps(self, latency_s: float, queued_latency_s: float | None = None,
                               clear: bool = True) -> float | None:
        """Link bandwidth implied by the collectives completed since the last call (ring
        all-reduce model; a collective's transfer starts at its issue or when the previous one
        finished, whichever is later, as the backend runs them one at a time). A collective that
        waited for the previous one pays the simulator's queued cost (`caramel.sim.collectives`):
        the lone latency less what was left of the previous transfer, at least `queued_latency_s`
        per message (a `ClusterSpec.effective_queued_latency_s`; `latency_s` when None). None if
        too little was sent to tell; `clear=False` keeps the collectives for the next call."""
        log = sorted(self.comm_log, key=lambda e: e[1])
        if clear:
            self.comm_log.clear()
        n = self.world_size
        if n < 2 or not log:
            return None
        steps = 2 * (n - 1)
        lone = steps * latency_s
        queued = steps * (latency_s if queued_latency_s is None else queued_latency_s)
        total_bits, total_s, prev_done, prev_transfer = 0.0, 0.0, 0.0, 0.0
        for issue, done, nbytes in log:
            start = max(issue, prev_done)
            dur = done - start - fixed_cost_s(lone, queued, hidden_transfer_s(issue, prev_done, prev_transfer))
            prev_done, prev_transfer = done, max(dur, 0.0)
            if dur > 0:
                total_bits += 2 * (n - 1) / n * nbytes * 8
                total_s += dur
        if total_s < 1e-3:
            return None
        return total_bits / total_s

    def _finalize_backward(self) -> None:
        """End of backward: fill in parameters without gradients, issue everything left."""
        for fb in self.buckets:
            if fb.ready:
                continue
            for j, done in enumerate(fb.fired):
                if not done:
                    fb.put(j, fb.params[j].grad)
            self._mark_ready(fb)
        self._dispatch()
        assert self._next_item == len(self.plan.order)
        for ex in self.row_exchanges:
            ex.start()
        self.recorder.record("compute", "backward", "backward", getattr(self, "_bwd_t0", self._fwd_t0), self.recorder.now())
        self._next_item = 0
        for fb in self.buckets:
            fb.new_iteration()
        self._callback_queued = False
        self._reduced = True
        self._pending_apply = set(range(len(self.buckets)))
        for cb in self.on_backward_end:
            cb()
        if self.overlap == "none":
            self._wait(sorted(self._pending_apply))

    # ---------------------------------------------------------------- waiting and applying

    def _wait(self, bucket_ids: list[int]) -> None:
        """Block until these buckets' collectives are done; one wait event per bucket, back to back."""
        t_start = tb0 = self.recorder.now()
        for b in bucket_ids:
            fb = self.buckets[b]
            for c, work in enumerate(fb.works):
                if work is None:
                    continue
                try:
                    work.wait()
                except Exception as e:  # noqa: BLE001 - re-raised with context
                    raise RuntimeError(
                        f"caramel: rank {self.rank}: all-reduce of bucket {b} chunk {c} (step {self.stats.step}) "
                        f"failed: {e}. A peer may have died or hung (timeout {self.timeout_s:g} s)") from e
                fb.works[c] = None
                if self.recorder.enabled:
                    key = (b, c)
                    issue = self._issue_t.pop(key, tb0)
                    done = self._comm_done.pop(key, None) or self.recorder.now()
                    self.recorder.record("comm", "comm", f"allreduce:b{b}c{c}", issue, done,
                                         bucket=b, chunk=c, nbytes=fb.chunks[c].numel() * fb.flat.element_size())
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
        """Run the user's optimizer on these buckets' parameters, with the hyper-parameters of
        the step that produced the gradients (a scheduler may have changed them since)."""
        t0 = self.recorder.now()
        groups = self.optimizer.param_groups
        saved_params = [g["params"] for g in groups]
        saved_hp: list[dict[str, Any]] = []
        swapped: list[tuple[nn.Parameter, torch.Tensor | None]] = []
        try:
            if self._hparams is not None:
                for g, snap in zip(groups, self._hparams):
                    cur = {k: g[k] for k in snap if g.get(k) is not snap[k]}
                    saved_hp.append(cur)
                    for k in cur:
                        g[k] = snap[k]
            subsets = [[] for _ in groups]
            for b in bucket_ids:
                fb = self.buckets[b]
                used = fb.used()
                for j, p in enumerate(fb.params):
                    swapped.append((p, p.grad))
                    p.grad = fb.grad_view(j) if used[j] else None
                for k, sub in enumerate(self._group_subsets[b]):
                    subsets[k].extend(sub)
            for g, sub in zip(groups, subsets):
                g["params"] = sub
            self.optimizer._caramel_inner_step()
        finally:
            for g, params in zip(groups, saved_params):
                g["params"] = params
            for g, cur in zip(groups, saved_hp):
                g.update(cur)
            for p, grad in swapped:
                p.grad = grad
        for b in bucket_ids:
            self._pending_apply.discard(b)
        if self.recorder.enabled:
            name = "apply:b" + ",".join(str(b) for b in bucket_ids) if len(bucket_ids) < 4 else "apply:all"
            self.recorder.record("compute", "optimizer", name, t0, self.recorder.now(),
                                 bucket=bucket_ids[0] if len(bucket_ids) == 1 else None)

    # ---------------------------------------------------------------- step / sync

    def step(self) -> bool:
        """The user's `optimizer.step()`. Returns False when no reduction happened (local step)."""
        self.step_calls += 1
        if self.passthrough:
            self._end_iteration()
            return False
        if self.delegating:
            # DDP's backward left averaged gradients in p.grad; the user's optimizer applies them
            # right after this returns, and the controller's checks run first as in any step
            self._end_iteration()
            if self.on_step_end is not None:
                self.on_step_end()
            return False
        if not self._reduced:
            return False
        self._reduced = False
        self._hparams = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
                         for g in self.optimizer.param_groups]
        if self.overlap != "forward" or self.sync_apply:
            self.synchronize(all_at_once=True)
        self._end_iteration()
        if self.on_step_end is not None:
            self.on_step_end()
        return True

    @property
    def wait_this_step_s(self) -> float:
        """Time blocked on communication since the last `step()` that reduced (or passed through)."""
        return self._wait_acc

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

    def delegate_to(self, ddp: nn.Module) -> None:
        """Hand gradient reduction to torch DDP wrapped around this engine's module (see the
        module docstring); nothing may be pending."""
        assert not self._pending_apply and not self._callback_queued
        self.ddp = ddp
        self.delegating = True

    def take_back(self) -> None:
        """Reduce gradients with the engine's own plan again (after a delegation)."""
        self.delegating = False

    def wait_reduced(self) -> None:
        """Wait for every outstanding collective without applying (for gradient clipping)."""
        if self.delegating:
            return  # DDP's backward returns only once every bucket is reduced
        self._wait(sorted(self._pending_apply))

    def reduced_grads(self) -> list[torch.Tensor]:
        """Views of the averaged gradients of globally used parameters of pending buckets."""
        if self.delegating:
            return [p.grad for p in self.params if p.grad is not None]
        out = []
        for b in sorted(self._pending_apply):
            fb = self.buckets[b]
            used = fb.used()
            out.extend(fb.grad_view(j) for j in range(len(fb.params)) if used[j])
        return out

    def gradients_to_params(self) -> None:
        """Wait for the reduction and put the averaged gradients into `p.grad` (DDP's way), for
        optimizers that read gradients themselves (closures). Nothing stays pending."""
        if not self._reduced:
            return
        todo = sorted(self._pending_apply)
        self._wait(todo)
        for b in todo:
            fb = self.buckets[b]
            for j, used in enumerate(fb.used()):
                fb.params[j].grad = fb.grad_view(j).clone() if used else None
        self._pending_apply.clear()
        self._reduced = False

    def has_unapplied_reduction(self) -> bool:
        if self.delegating:
            return any(p.grad is not None for p in self.params)
        return self._reduced

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
        self.comm = None
        self.delegating, self.ddp = False, None  # a later step is an error here too, not DDP quietly
        for holder in self.group_holders:
            if hasattr(holder, "drain"):
                holder.drain()
            holder.pg = None
        if self.ddp_group is not None:
            group, self.ddp_group = self.ddp_group, None
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 - the job's default group may be gone already at exit
                pass

    def remove_hooks(self) -> None:
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
            "plan_fingerprint": self.plan.fingerprint if self.plan else None, "overlap": self.overlap,
            "buckets": len(self.buckets), "items": len(self.plan.order) if self.plan else 0,
            "overlap_trial": s.extra.get("overlap_trial"), "delegated_to_ddp": self.delegating,
            "plan": self._plan_summary(),
            "comm_priority": self.comm_priority.to_dict() if self.comm_priority is not None else None,
        }

    def _plan_summary(self) -> dict[str, Any] | None:
        """What the running plan is and what it was made for (None without a plan)."""
        if self.plan is None:
            return None
        cluster = self.plan.options.get("cluster", {})
        return {"planner": self.plan.planner, "order": self.plan.options.get("order"),
                "bucket_bytes": [b.bytes for b in self.plan.buckets], "items": len(self.plan.order),
                "predicted_step_time_s": self.plan.predicted_step_time_s,
                "bandwidth_bps": cluster.get("bandwidth_bps"), "latency_s": cluster.get("latency_s"),
                "queued_latency_s": cluster.get("queued_latency_s"),
                "collective_cpu_s": cluster.get("collective_cpu_s")}
