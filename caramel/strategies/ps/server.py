"""Dedicated parameter-server processes (`ps:servers=N,dedicated=true`, or CARAMEL_PS_SERVERS=N).

As in BytePS, the launch starts the workers and N server processes in one world, and every
process runs the user's script: the last N ranks serve shard 0..N-1, the others train. On a
server rank `caramel.parallelize(model, opt, "ps:...")` does not return a model: it runs
`PsServer.serve()` until the workers are done (`caramel.shutdown()`, or their exit handler),
then raises `ServerFinished` (a `SystemExit` with code 0), so the script exits cleanly
without a line of it changing.

The workers drive the servers with one small all-reduce per message on the `cmd` group (rank
0 puts the command in, every other rank zero; a step's message also carries the per-parameter
"someone used it" counts, as the colocated engine's does). A server handles them in order:

- STEP: take part in the step's reductions of its shard's parameters (contributing zeros,
  in the plan's push order), apply the user's optimizer to the shard with the hyper-parameters
  rank 0 sent when they last changed, and broadcast the shard back in the plan's pull order,
  one pull bucket at a time on gloo (`sender.py`: the wire order is the planned order);
- GATHER: its optimizer state to every worker (`optimizer.synchronize()` on the workers);
- PLAN: the plan made after the online profile, and the optimizer state that moves with it;
- LOAD: rank 0's parameters and loaded optimizer state (`optimizer.load_state_dict`);
- DONE: every pull sent; the server leaves.

The server waits for the next message up to SERVER_IDLE_TIMEOUT_S, so workers may validate or
checkpoint for a long time between steps; a worker that dies closes its connections (an error
at once), and one that hangs makes the other workers' transfers time out, which ends them.
The transfers themselves run on the job's timeout, so a dead or silent server fails the
workers' next push or pull within it, as a dead worker does.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from collections import deque
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.profiler import unique_params
from caramel.runtime.apply import snapshot_hparams
from caramel.strategies.ps.buckets import recv_buf, send_buf, unflatten
from caramel.strategies.ps.engine import CMD_DONE, CMD_GATHER, CMD_LOAD, CMD_PLAN, CMD_STEP, ORDER_LOG_UPDATES
from caramel.strategies.ps.sender import SerialSender, send_pull, uses_sender
from caramel.strategies.ps.transfers import PsGroups
from caramel.strategies.rank_failure import raise_failed
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.planner import PsPlan
from caramel.strategies.ps.state import (clip_shard, gather_full_state, keep_own_state, move_state, recv_object,
                                         step_shard)

SERVERS_ENV = "CARAMEL_PS_SERVERS"  # set by the launcher (`caramel cluster run --ps-servers N`)
SERVER_IDLE_TIMEOUT_S = 24 * 3600.0  # how long a server waits for the workers' next message
MESSAGES = {CMD_STEP: "step", CMD_GATHER: "gather", CMD_PLAN: "plan", CMD_LOAD: "load"}


class ServerFinished(SystemExit):
    """Raised on a dedicated server rank by `parallelize` once the workers are done: exits the
    user's script with code 0. `stats` says what the server did (catch it to read them)."""

    def __init__(self, stats: dict[str, Any]):
        super().__init__(0)
        self.stats = stats


def dedicated_servers(options: PsOptions, world: int) -> int:
    """How many of the `world` ranks are dedicated servers (0: colocated), from the options and
    CARAMEL_PS_SERVERS; one clear error on conflicting or impossible counts."""
    raw = os.environ.get(SERVERS_ENV, "").strip()
    env = None
    if raw:
        try:
            env = int(raw)
        except ValueError:
            raise CaramelError(f"{SERVERS_ENV} must be an integer >= 0 (how many ranks are dedicated parameter "
                               f"servers), got {raw!r}") from None
        if env < 0:
            raise CaramelError(f"{SERVERS_ENV} must be >= 0, got {env}")
    if env and options.servers not in (0, env):
        raise CaramelError(f"ps: servers={options.servers} but {SERVERS_ENV}={env} (the launcher's dedicated servers); "
                           f"give one count, or the same in both")
    if not options.dedicated and not env:
        return 0
    n = env or options.servers
    if n < 1:
        raise CaramelError(f"ps: dedicated=true needs servers=N >= 1 (or {SERVERS_ENV}=N from the launcher), got 0")
    if options.hierarchical:
        raise CaramelError("ps: dedicated servers and hierarchical=true do not combine yet; pick one")
    if n >= world:
        raise CaramelError(f"ps: {n} dedicated servers but the job has only {world} ranks; at least one rank must be "
                           f"a worker (launch workers + {n} processes; the last {n} ranks serve)")
    return n


def command(groups: PsGroups, rank: int, n_params: int, code: int, device: torch.device) -> None:
    """Workers: send one message (not a step) to the servers."""
    msg = torch.zeros(n_params + 2, device=device)
    if rank == 0:
        msg[-2] = float(code)
    dist.all_reduce(msg, group=groups.cmd)
    if code == CMD_DONE:
        # each worker tells every server it is past the all-reduce: a server that closed its
        # connections while a worker still finished that all-reduce would break the worker's
        for s in groups.dedicated:
            dist.send(torch.zeros(1, device=device), dst=dist.get_global_rank(groups.cmd, s), group=groups.cmd)


def make_groups(ranks: list[int], servers: int, timeout: datetime.timedelta, clip: bool = False) -> PsGroups:
    """The groups of a job with dedicated servers (every rank creates every group, in order):
    control over all; buffers over the workers; per shard, push and pull over the workers and
    that shard's server, so a transfer involves no other server; cmd over all, patient."""
    world = len(ranks)
    workers, served_by = ranks[:world - servers], list(range(world - servers, world))
    control = dist.new_group(ranks, timeout=timeout)
    buffers = dist.new_group(workers, timeout=timeout)
    push = [dist.new_group(workers + [ranks[s]], timeout=timeout) for s in served_by]
    pull = [dist.new_group(workers + [ranks[s]], timeout=timeout) for s in served_by]
    cmd = dist.new_group(ranks, timeout=max(timeout, datetime.timedelta(seconds=SERVER_IDLE_TIMEOUT_S)))
    hp = dist.new_group([ranks[0]] + [ranks[s] for s in served_by], timeout=timeout)
    clip_group = dist.new_group([ranks[s] for s in served_by], timeout=timeout) if clip else None
    return PsGroups(control, buffers, push, pull, dedicated=served_by, cmd=cmd, hp=hp, clip=clip_group)


class PsServer:
    """One dedicated server: its shard of the user's optimizer, driven by the workers' messages."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, plan: PsPlan, groups: PsGroups,
                 ranks: list[int], clip_grad_norm: float = 0.0):
        self.clip_grad_norm = clip_grad_norm
        self.module, self.optimizer, self.plan, self.groups, self.ranks = module, optimizer, plan, groups, ranks
        self.rank = dist.get_rank(groups.control)
        self.shard = groups.dedicated.index(self.rank)
        _, self.params = unique_params(module)
        self.device = self.params[plan.params[0]].device
        self.hparams = snapshot_hparams(optimizer)
        self.steps = 0
        self.sends: list[tuple[Any, torch.Tensor]] = []
        self.sender = SerialSender() if uses_sender([groups.pull[self.shard]]) else None  # gloo: one pull at a time
        self.send_log: deque[tuple[int, list[int]]] = deque(maxlen=ORDER_LOG_UPDATES)  # (step, its pull buckets sent)
        self.messages = {name: 0 for name in MESSAGES.values()}

    def owners(self) -> dict[int, int]:
        return {i: self.groups.dedicated[self.plan.owner[i]] for i in self.plan.params}

    def serve(self) -> dict[str, Any]:
        """Handle the workers' messages until DONE; returns what was done."""
        n = len(self.plan.params)
        while True:
            msg = torch.zeros(n + 2, device=self.device)
            dist.all_reduce(msg, group=self.groups.cmd)
            code = int(round(float(msg[-2])))
            if code == CMD_DONE:
                for w in range(len(self.ranks) - len(self.groups.dedicated)):  # every worker is past it
                    dist.recv(torch.zeros(1, device=self.device), src=dist.get_global_rank(self.groups.cmd, w),
                              group=self.groups.cmd)
                break
            if code == CMD_STEP:
                self._step(msg[:n].tolist(), send_hp=float(msg[-1]) > 0)
            elif code == CMD_GATHER:
                self._wait_sends()
                gather_full_state(self.optimizer, self.params, self.owners(), self.rank, self.groups.control)
            elif code == CMD_PLAN:
                self._plan()
            elif code == CMD_LOAD:
                self._load()
            else:
                raise CaramelError(f"ps server (rank {self.ranks[self.rank]}): unknown message {code} from the workers; "
                                   f"every rank must run the same caramel")
            self.messages[MESSAGES[code]] += 1
        self._wait_sends()
        self._close_sender()
        return {"shard": self.shard, "steps": self.steps, "messages": dict(self.messages),
                "params": [i for i in self.plan.params if self.plan.owner[i] == self.shard],
                "send_log": list(self.send_log), "issued": list(self.sender.issued) if self.sender is not None else None}

    def _step(self, used: list[float], send_hp: bool) -> None:
        if send_hp:
            self.hparams = recv_object(self.ranks[0], self.groups.hp, self.device)
        me = self.ranks[self.rank]
        # the shard's buckets in push order, each one flat tensor, as the workers send them
        buckets = [members for members in self.plan.buckets if self.plan.owner[members[0]] == self.shard]
        mine = [i for members in buckets for i in members]
        flats = [recv_buf([self.params[i] for i in m]).zero_() for m in buckets]
        works = [dist.reduce(f, dst=me, group=self.groups.push[self.shard], async_op=True) for f in flats]
        grads = {i: v for m, f in zip(buckets, flats) for i, v in zip(m, unflatten(f, [self.params[i] for i in m]))}
        for w in works:
            w.wait()
        counted = dict(zip(self.plan.params, used))
        if self.groups.clip is not None:
            clip_shard(grads, [i for i in mine if counted[i] > 0], self.clip_grad_norm, self.groups.clip, self.device)
        step_shard(self.optimizer, self.params, [i for i in mine if counted[i] > 0], grads, self.hparams,
                   lambda: type(self.optimizer).step(self.optimizer))
        self._reap_sends()
        order = [b for b in self.plan.bucket_pull_at(self.steps) if self.plan.pull_owner(b) == self.shard]
        for bucket in order:
            buf = send_buf([self.params[i] for i in self.plan.pull_buckets[bucket]])
            self.sends.append((send_pull(self.sender, buf, me, self.groups.pull[self.shard], bucket,
                                         f"pull of bucket {bucket} (shard {self.shard})"), buf))
        self.send_log.append((self.steps, order))
        self.steps += 1

    def _plan(self) -> None:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.ranks[0], group=self.groups.control)
        try:  # the last step's pulls drained first, as on success: the workers wait for them
            self._wait_sends()
        finally:  # rank 0 could not plan: the workers raise it too
            raise_failed("ps plan", {0: box[0]}, self.rank, ranks=self.ranks)
        old = self.owners()
        self.plan = PsPlan.from_dict(box[0][0])
        move_state(self.optimizer, self.params, old, self.owners(), self.rank, self.groups.control)
        send_values(self.params, self.plan.params, self.ranks, self.groups.control)  # a moved shard's values too

    def _load(self) -> None:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.ranks[0], group=self.groups.control)
        values, state = box[0]
        self._wait_sends()
        with torch.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(v)
        type(self.optimizer).load_state_dict(self.optimizer, state)
        keep_own_state(self.optimizer, self.params, self.owners(), self.rank)

    def _reap_sends(self) -> None:
        """Forget the pulls that are through; one that failed raises here, naming the bucket."""
        flags = [w.is_completed() for w, _ in self.sends]
        for (w, _), done in zip(self.sends, flags):
            if done:
                w.wait()
        self.sends = [s for s, done in zip(self.sends, flags) if not done]

    def _wait_sends(self) -> None:
        for w, _ in self.sends:
            w.wait()
        self.sends = []

    def _close_sender(self) -> None:
        if self.sender is not None:
            self.sender.close()  # ends by the pull group's timeout at the latest (`SerialSender.close`)

    def release(self) -> None:
        self._close_sender()  # before its groups go
        for g in self.groups.all():
            with contextlib.suppress(Exception):
                dist.destroy_process_group(g)


def send_load(groups: PsGroups, ranks: list[int], rank: int, params: list[nn.Parameter],
              state: dict[str, Any], n_params: int) -> None:
    """Workers, after `optimizer.load_state_dict`: rank 0's parameters and that state to the servers."""
    command(groups, rank, n_params, CMD_LOAD, params[0].device)
    box: list[Any] = [([p.detach().cpu() for p in params], state) if rank == 0 else None]
    dist.broadcast_object_list(box, src=ranks[0], group=groups.control)


def send_values(params: list[nn.Parameter], idx: list[int], ranks: list[int], group: Any) -> None:
    """Rank 0's values of these parameters to every rank: after a new placement a server holds
    parameters it has not updated so far (rank 0, a worker that has pulled every update, has
    them all)."""
    with torch.no_grad():
        for i in idx:
            dist.broadcast(params[i].detach(), src=ranks[0], group=group)


def serve_and_leave(model: nn.Module, optimizer: torch.optim.Optimizer, plan: PsPlan, groups: PsGroups,
                    ranks: list[int], clip_grad_norm: float = 0.0) -> None:
    """A dedicated server rank: serve until the workers are done, then leave the script (exit 0)."""
    server = PsServer(model, optimizer, plan, groups, ranks, clip_grad_norm)
    try:
        stats = server.serve()
    finally:
        server.release()
    raise ServerFinished(stats)
