"""`PsEngine`: colocated parameter servers on torch.distributed, as one object per model.

Every rank is a worker, and the ranks named by the plan's owners also serve a shard (BytePS's
colocated mode). One step, for update u (= the step that produced the gradients):

1. push: as each bucket's gradients are all ready in backward (a bucket: parameters of one
   shard fused into one flat tensor, `buckets.py`) it goes to its owner (every other worker
   sends it, the owner adds them up: `_send_push`, on the pusher's own pull group when it
   serves, else the server's push group: `link_group`; on gloo the owner posts its receives
   at the step's first gradient, `_expect_pushes`; with dedicated servers a `dist.reduce` on
   the push groups; with a hierarchy a reduce within the node, then each leader's node sum sent
   to the server leader as soon as it lands on gloo, reduced among the leaders off gloo,
   `hierarchy.py`), in the plan's bucket order (a bucket is handed to the backend only after
   every earlier one: TicTac's counter rule); `step()` pushes what never became ready (zeros)
   and a per-parameter "someone used it" count;
2. apply: the owner waits for its reductions and runs the user's own optimizer on its shard
   only, with the hyper-parameters of the step that made the gradients;
3. pull: every rank takes part in one broadcast per pull bucket (parameters of one shard in
   the order the forward needs them) from its owner on that server's pull group, in the plan's
   pull order; the server hands them to the backend one at a time (`sender.py`; with a
   hierarchy the server leader to the leaders, then each leader its relays to its node), so
   the wire order is the planned order; receivers land in a staging buffer;
4. the next forward: a module's pre-hook copies in the pulls of the parameters it uses first,
   waiting only for those still needed, so pulls overlap the forward (`pulls.py`).

Consistency: an update is applied at the latest when the step count reaches u + S (S = 0 for
bsp, S for ssp:S, ASP_BOUND_STEPS for asp), earlier when its reductions have already arrived
or every rank has pushed it (colocated flat and hierarchical on gloo only the latter: a
point-to-point push reports completion only once waited on, so `Update.arrived()` stays
false at a server there); a forward waits only for parameters more than S updates old
(asp: never, up to the bound). Pushes and pulls run on private groups, one of each per server
(`PsGroups`), so each group sees the same sequence of collectives on every rank whatever the
timing, and different servers' transfers proceed side by side. Gradient accumulation
(`no_sync`) and tied parameters work as in DDP.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import broadcast_coalesced
from caramel.profile.profiler import unique_params
from caramel.runtime.apply import snapshot_hparams
from caramel.strategies.ps.buckets import flatten, unflatten
from caramel.strategies.ps.hierarchy import NodeSums
from caramel.strategies.ps.options import ASP_BOUND_STEPS, PsOptions
from caramel.strategies.ps.planner import PsPlan
from caramel.strategies.ps.pulls import PsPulls
from caramel.strategies.ps.sender import SerialSender, send_pull, uses_sender
from caramel.strategies.ps.staleness import StalenessControl
from caramel.strategies.ps.state import clip_shard, hparams_key, send_object, step_shard
from caramel.strategies.ps.transfers import Pull, PsGroups, Update

CMD_STEP, CMD_GATHER, CMD_PLAN, CMD_LOAD, CMD_DONE = 1, 2, 3, 4, 5  # workers -> dedicated servers (`server.py`)

ORDER_LOG_UPDATES = 64  # how many updates' pull (send) orders are kept for inspection


class PsEngine(PsPulls):
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, options: PsOptions, plan: PsPlan,
                 groups: PsGroups, ranks: list[int], buffer_sync: Any = None, share_buffers: bool = True):
        self.module, self.optimizer, self.options, self.plan = module, optimizer, options, plan
        self.groups, self.ranks, self.hier = groups, ranks, groups.hier
        self.relays: deque[tuple[Any, torch.Tensor, int]] = deque()  # hierarchical, at a leader: (landed?, buf, bucket) to relay in order
        self.rank, self.world = dist.get_rank(groups.control), dist.get_world_size(groups.control)
        self.workers = self.world - len(groups.dedicated)  # gradients are averaged over the workers only
        self.sent_hparams: Any = None  # dedicated servers: the hyper-parameters rank 0 last sent them
        self.bound = options.staleness_bound()
        self.buffer_sync = buffer_sync  # bsp: rank 0's buffers, sent early at step() (`buffer_sync.py`)
        self.share_buffers = share_buffers  # False: broadcast_buffers=False, every rank keeps its own
        self.names, self.params = unique_params(module)
        self.require_sync = True
        self.steps = 0  # steps whose gradients were pushed
        self.version = {i: 0 for i in plan.params}  # updates each parameter holds here
        self.pending: deque[Update] = deque()
        self.pulls: dict[int, deque[Pull]] = {i: deque() for i in plan.params}
        self.sends: list[tuple[Any, torch.Tensor]] = []
        self.sender, self.relay_sender = self._senders()
        self.node_sums = NodeSums(self) if self.hier is not None else None  # past the node's reduce
        self.early_receives = self.posts_receives_early(groups)
        self.current: Update | None = None
        self.ready: set[int] = set()
        self.next_push = 0  # the next bucket (plan.buckets position) to push
        self.bucket_of = {i: b for b, members in enumerate(plan.buckets) for i in members}
        self.send_log: deque[tuple[int, list[int]]] = deque(maxlen=ORDER_LOG_UPDATES)
        self.handles: list[Any] = []
        self.waits_for: dict[str, list[int]] = {}
        self.wait_s = 0.0  # seconds spent waiting for pulls, all told
        self.applied = 0  # updates applied (and pulled) so far
        self.last_issue_t = 0.0  # when the latest update's first pull was handed to the backend
        self.ready_callback: Any = None  # profiling: told each parameter whose gradient is ready
        self.stale = StalenessControl(self, options.staleness) if options.staleness != "none" and self.bound != 0 \
            else None  # staleness=pace/predict/compensate/scale (`staleness.py`); bsp is untouched
        self._hook_handles()

    def _senders(self) -> tuple[SerialSender | None, SerialSender | None]:
        """This rank's pulls, one at a time per link (`sender.py`), on gloo: a colocated
        server's to every rank, or, hierarchical, a leader's to the other leaders (as a server)
        and its relays to its node. Dedicated servers' workers send no pulls."""
        h = self.hier
        if self.groups.dedicated or (h is not None and not h.is_leader):
            return None, None
        if h is None:
            return (SerialSender() if uses_sender(self.groups.pull) else None), None
        return (SerialSender() if uses_sender(h.lead_pull) else None,
                SerialSender() if uses_sender([h.node_pull]) else None)

    # --- hooks -------------------------------------------------------------------------
    def _hook_handles(self) -> None:
        for i in self.plan.params:
            self.handles.append(self.params[i].register_post_accumulate_grad_hook(self._on_ready(i)))

    def set_waits(self, waits_for: dict[str, list[int]]) -> None:
        """Module name -> the parameters its pre-hook brings up to date (those it uses first)."""
        for h in getattr(self, "_module_handles", []):
            h.remove()
        self._module_handles = []
        self.waits_for = waits_for
        named = dict(self.module.named_modules())
        for name, idx in waits_for.items():
            if name in named and name != "":
                self._module_handles.append(named[name].register_forward_pre_hook(self._pre_hook(idx)))

    def _pre_hook(self, idx: list[int]):
        def hook(_m, _args):
            self.catch_up(idx, forward=True)
        return hook

    def _on_ready(self, i: int):
        def hook(_p):
            if self.ready_callback is not None:
                self.ready_callback(i)
            if self.require_sync:
                self._update()  # at the step's first gradient: a server posts its receives here
                self.ready.add(i)
                self._push_ready()
        return hook

    # --- push --------------------------------------------------------------------------
    def _update(self) -> Update:
        if self.current is None:
            self.current = Update(self.steps, hparams=snapshot_hparams(self.optimizer))
            if self.node_sums is not None and self.node_sums.sent:
                self.node_sums.expect(self.current)
            elif self.early_receives:
                self._expect_pushes(self.current)
        return self.current

    @staticmethod
    def posts_receives_early(groups: PsGroups) -> bool:
        """Colocated flat servers post their receives at the step's first gradient on gloo
        (`_expect_pushes`), and at their own bucket's push off gloo: NCCL sets up each pair's
        point-to-point communicator lazily and blocking, so two servers each posting a receive
        from the other before either sends could wait for each other (as `NodeSums.
        sends_point_to_point`; not run on a GPU here). The same answer on every rank."""
        return groups.hier is None and not groups.dedicated and uses_sender(list(groups.pull) + list(groups.push))

    def _expect_pushes(self, u: Update) -> None:
        """At a colocated server, at the step's first gradient: post a receive for every other
        worker's push of each bucket it serves. Gloo moves a point-to-point message only once
        both ends have posted it, so a receive posted at the server's own push of the bucket
        (the path off gloo) held a faster worker's push until the server's own gradients were
        ready; posted here, each push travels as soon as its worker has it."""
        for b, members in enumerate(self.plan.buckets):
            if self.server_of(members[0]) == self.rank:
                u.incoming[b] = self._recv_pushes(u, b, self._recv_buf(members))

    def _push(self, b: int) -> None:
        members = self.plan.buckets[b]
        u = self._update()
        grads = [self.params[i].grad for i in members]
        flat = flatten([g if g is not None else torch.zeros_like(self.params[i]) for i, g in zip(members, grads)])
        flat.div_(self.workers)
        for i, view in zip(members, unflatten(flat, [self.params[i] for i in members])):
            u.grads[i] = view
        u.flats[b] = flat
        i = members[0]
        if self.hier is None and not self.groups.dedicated:
            self._send_push(u, b, flat, self.server_of(i))
            return
        if self.hier is None:
            u.works.append(dist.reduce(flat, dst=self.ranks[self.server_of(i)], group=self.groups.push[self.plan.owner[i]],
                                       async_op=True))
            return
        work = dist.reduce(flat, dst=self.ranks[self.hier.leader], group=self.hier.node_push, async_op=True)
        self.node_sums.push(u, b, flat, work, self.server_of(i))

    def _send_push(self, u: Update, b: int, flat: torch.Tensor, server: int) -> None:
        """Bucket `b`'s push as a parameter server's push: every other worker sends its copy to
        the server, which adds them to its own, in rank order, once they are in (`_apply`). Not gloo's
        reduce: that runs a ring reduce-scatter and then a gather, so the server sends half of
        every bucket back out and, with 2 servers, each direction of a link carries 3/4 of the
        model's bytes a step instead of 1/2 (docs/ps.md, "Simulator against runtime").
        Each push travels on `link_group` (see there: behind it, not beside it, go the pusher's pulls)."""
        if server != self.rank:
            u.works.append(dist.isend(flat, self.ranks[server], group=self.link_group(self.rank, server), tag=b))
            return
        parts = u.incoming.pop(b) if self.early_receives else self._recv_pushes(u, b, flat)
        u.sums.append((b, flat, parts))

    def _recv_pushes(self, u: Update, b: int, like: torch.Tensor) -> list[torch.Tensor]:
        """Post this server's receives of every other worker's push of bucket `b`, in rank order."""
        parts = []
        for j in range(self.workers):
            if j != self.rank:
                parts.append(torch.empty_like(like))
                u.works.append(dist.irecv(parts[-1], self.ranks[j], group=self.link_group(j, self.rank), tag=b))
        return parts

    def link_group(self, worker: int, server: int) -> Any:
        """The group carrying `worker`'s pushes to `server` (colocated, flat). A rank that serves
        a shard pushes on its own shard's pull group, the group its pulls go out on: one gloo
        group is one TCP connection per pair of ranks, so on the link from that rank to `server`
        its pulls queue behind its pushes instead of sharing the link with them. A gloo send
        is complete once the kernel holds its bytes, so a server can apply and start its pulls
        while its own pushes to another server are still on the wire; side by side, the first
        pull bucket moved at 178-269 (median 207) of 300 Mbit/s, likely slowing those pushes
        and so the other server's update and the pulls this rank waits for (docs/ps.md,
        "Pushes before pulls on each link"). A rank that serves nothing sends no pulls and
        pushes on the server's push group.

        Pushes go first under bsp (measured); under ssp/asp a step's pushes may queue behind
        an earlier update's pulls. NCCL: a lone send/recv runs on a 2-rank communicator of its
        own per pair, so the routing changes nothing there. Two threads use this group: the
        training thread's point-to-point sends and the sender thread's broadcasts. That is
        safe on gloo's internals, not by PyTorch's promise: a send runs in the calling thread
        on the bare tag (broadcast slots carry a prefix; p2p does not advance the collective
        counter) and the TCP pair is locked; only the debugging counter `seq_` is raced. A
        broadcast from the training thread on this group would not be covered."""
        if worker < self.plan.shards:  # colocated, flat: rank k serves shard k
            return self.groups.pull[worker]
        return self.groups.push[server]

    def server_of(self, i: int) -> int:
        """The group rank serving parameter i."""
        shard = self.plan.owner[i]
        if self.groups.dedicated:
            return self.groups.dedicated[shard]
        return self.hier.server(shard) if self.hier is not None else shard

    def server_ranks(self) -> dict[int, int]:
        return {i: self.server_of(i) for i in self.plan.params}

    def _push_ready(self) -> None:
        buckets = self.plan.buckets
        while self.next_push < len(buckets) and all(i in self.ready for i in buckets[self.next_push]):
            self._push(self.next_push)
            self.next_push += 1
        if self.current is not None and self.current.relay:
            self.node_sums.forward(self.current, force=False)
        if self.relays:
            self.relay_pulls()

    def finish_pushes(self) -> None:
        """At step(): push what never became ready (zeros) and who used what."""
        u = self._update()
        while self.next_push < len(self.plan.buckets):
            self._push(self.next_push)
            self.next_push += 1
        if self.hier is not None and self.hier.is_leader:
            self.relay_pulls(force=True)  # the node's ranks may be waiting for these before they push
            self.node_sums.forward(u, force=True)
        used = [float(self.params[i].grad is not None) for i in self.plan.params]
        if self.stale is not None:  # busy seconds (pacing: who is the slowest) and lags, each rank in its slot
            used += self.stale.busy_slots() + self.stale.lag_slots()
        send_hp = False
        if self.groups.dedicated:  # the step's message to the servers: who used what, then the command
            send_hp = self.rank == 0 and hparams_key(u.hparams) != self.sent_hparams
            used += [float(CMD_STEP) if self.rank == 0 else 0.0, float(send_hp)]
        u.used = torch.tensor(used, device=self.params[self.plan.params[0]].device)
        u.used_work = dist.all_reduce(u.used, group=self.groups.cmd or self.groups.control, async_op=True)
        if send_hp:  # an LR scheduler moved: the servers apply this step with the new values
            # without waiting: the servers read them only once every worker has reached step()
            self.sends += send_object(u.hparams, self.ranks[0], self.groups.hp, u.used.device)
            self.sent_hparams = hparams_key(u.hparams)
        self.pending.append(u)
        self.current, self.ready, self.next_push = None, set(), 0
        self.steps += 1

    # --- apply and pull ------------------------------------------------------------------
    def apply_due(self, force_all: bool = False) -> None:
        """Apply every update that is due (older than the bound) or has already arrived."""
        limit = ASP_BOUND_STEPS if self.bound is None else self.bound
        while self.pending:
            u = self.pending[0]
            due = force_all or u.step < self.steps - limit
            if not due and not u.arrived() and not u.everyone_pushed():
                break
            self.pending.popleft()
            self._apply(u)

    def apply_next(self) -> None:
        self._apply(self.pending.popleft())

    def _apply(self, u: Update) -> None:
        for w in u.works:
            w.wait()
        u.works = []  # a gloo send or receive waited twice waits for a second message: never again
        u.used_work.wait()
        counts = u.used.tolist()
        used = {i: bool(c > 0) for i, c in zip(self.plan.params, counts)}
        if self.stale is not None:
            self.stale.applied(counts)
        for b, flat, parts in u.sums:  # this server's buckets: the other workers' pushes, in rank order
            if self.stale is not None:  # compensate corrects, scale divides, each before they are added up
                self.stale.compensate(u.step, b, flat, parts, used)
            for part in parts:
                flat.add_(part)
        u.sums = []
        mine = [i for i in self.plan.params if self.server_of(i) == self.rank]
        if self.groups.clip is not None:  # every rank takes part (a non-server adds 0), in update order
            clip_shard(u.grads, [i for i in mine if used[i]], self.options.clip_grad_norm, self.groups.clip,
                       self.params[self.plan.params[0]].device)
        self._reap_sends()
        if mine:
            if self.stale is not None:
                self.stale.owner_step(mine, lambda: self._step_shard([i for i in mine if used[i]], u), u.step)
            else:
                self._step_shard([i for i in mine if used[i]], u)
            for i in mine:
                self.version[i] = u.step + 1
        if self.buffer_sync is not None and u.step == self.steps - 1:
            self.buffer_sync.send_early()  # before the pulls: it must not queue behind them
        order = self.plan.bucket_pull_at(u.step)
        issued_t = time.perf_counter()
        for b in order:
            members = self.plan.pull_buckets[b]
            i = members[0]
            src = self.ranks[self.server_of(i)]
            if self.hier is not None:
                self._pull_hierarchical(b, u.step + 1)
            elif self.server_of(i) == self.rank:
                buf, shard = self._send_buf(members), self.plan.owner[i]
                self.sends.append((send_pull(self.sender, buf, src, self.groups.pull[shard], b,
                                             f"pull of bucket {b} (shard {shard})"), buf))
            else:
                buf = self._recv_buf(members)
                work = dist.broadcast(buf, src=src, group=self.groups.pull[self.plan.owner[i]], async_op=True)
                self._expect(members, u.step + 1, work, buf)
        self.send_log.append((u.step, [i for b in order for i in self.plan.pull_buckets[b]]))
        self.applied += 1
        self.last_issue_t = issued_t

    def _step_shard(self, idx: list[int], u: Update) -> None:
        step_shard(self.optimizer, self.params, idx, u.grads, u.hparams, self.optimizer._caramel_inner_step)

    def synchronize(self) -> None:
        """Every pushed update applied and pulled (all ranks call this); ssp/asp send rank 0's
        buffers here (unless broadcast_buffers=False), bsp leaves each rank its own until the
        next forward, as DDP does."""
        self.apply_due(force_all=True)
        self.relay_pulls(force=True)
        self.catch_up(self.plan.params, required=self.steps)
        if self.stale is not None:
            self.stale.restore(self.plan.params)
        self._wait_sends()
        if self.buffer_sync is not None:
            self.buffer_sync.drain()  # the next forward DDP syncs broadcasts them as DDP does
        if self.share_buffers and self.workers > 1 and self.bound != 0:  # rank 0's buffers, coalesced per dtype and device
            broadcast_coalesced(list(self.module.buffers()), self.ranks[0], self.groups.buffers)

    def staleness(self) -> int:
        """Updates this rank's parameters lag the steps pushed so far (the worst parameter)."""
        return self.steps - min(self.version.values(), default=self.steps)

    def remove_hooks(self) -> None:
        for h in self.handles + getattr(self, "_module_handles", []):
            h.remove()
        self.handles, self._module_handles = [], []
        for sender in (self.sender, self.relay_sender):
            if sender is not None:
                sender.close()
        if self.node_sums is not None:
            self.node_sums.close()

