"""One model under the `gossip` strategy: `GossipRun` owns the exchange, the step count and the log.

`parallelize_gossip` (`caramel.strategies.gossip.parallelize`) checks the inputs, makes the process
groups and starts every worker from rank 0's model; the `GossipRun` it builds then does the work
of each step: mixing before each module's forward, sending after `optimizer.step()`, measuring
consensus, averaging, checkpoint state and release. Kept apart from the entry point so the run's
life cycle reads on its own.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import group_alive
from caramel.errors import CaramelError
from caramel.profile.profiler import optimizer_class, unique_params
from caramel.strategies.gossip.engine import Exchange, make_buckets
from caramel.strategies.gossip.moments import SecondMoment
from caramel.strategies.gossip.options import GossipOptions
from caramel.strategies.gossip.topology import check_mixing, describe, mixing_matrix, neighbours, period
from caramel.strategies.gossip.tracking import Tracker
from caramel.strategies.gossip.volume import moment_keys as keys_for
from caramel.trace.events import Trace, TraceEvent

# The trackers' messages carry tags from here on, apart from the parameters' (both may be in
# flight at once when the trackers leave in backward).
TRACKER_TAG_BASE = 1 << 20


class GossipRun:
    """One model under the gossip strategy: its exchange, step count and per-step log."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, options: GossipOptions, ranks: list[int],
                 groups: tuple[Any, Any], control: Any, trace: str | None):
        self.module, self.optimizer, self.options, self.ranks = module, optimizer, options, ranks
        self.groups, self.control, self.trace_path = groups, control, trace
        self.world, self.rank = len(ranks), ranks.index(dist.get_rank())
        self.mixing_name = options.topology if isinstance(options.topology, str) else "matrix"
        self.matrices = [mixing_matrix(options.topology, self.world, t) for t in range(period(options.topology, self.world))]
        for W in self.matrices:
            check_mixing(W, self.world, source=f"gossip topology {self.mixing_name!r}",
                         require_connected=len(self.matrices) == 1)
        names, params = unique_params(module)
        # A parameter frozen at parallelize() (requires_grad=False) is neither gossiped nor tracked:
        # it is rank 0's everywhere and nothing moves it (its mix would only add rounding).
        self.shared = [(n, p) for n, p in zip(names, params) if not options.is_local(n) and p.requires_grad]
        self.fixed = [(n, p) for n, p in zip(names, params) if not options.is_local(n) and not p.requires_grad]
        self.local_names = [n for n in names if options.is_local(n)]
        self.local_params = [p for n, p in zip(names, params) if options.is_local(n)]
        self.shared_buffers = [(n, b) for n, b in module.named_buffers()
                               if b.is_floating_point() and not options.is_local(n)]
        self.exchange = Exchange(groups, ranks, self.rank, mix_in_forward=not options.mixes_at_update)
        if options.mixes_at_update:
            # The next forward updates the buffers (BatchNorm's running statistics) in place
            # before the mix lands at the update; setting them to the mix would drop that update
            # every step (the statistics froze). As an increment, b <- b + (W b_sent - b_sent),
            # they get the same form as the parameters: the mix of the sent values plus this
            # step's local change. Mixing them in the forward instead would make the forward
            # wait for arrivals, which this mode exists to avoid.
            self.exchange.increments = {id(b) for _, b in self.shared_buffers}
        # algorithm=tracking: the trackers travel in their own buckets, mixed before the update
        self.tracker = (Tracker(self.shared, Exchange(groups, ranks, self.rank, mix_in_forward=False,
                                                      tag_base=TRACKER_TAG_BASE),
                                overlap=options.overlaps_trackers, layout=self._tracker_layout)
                        if options.tracks else None)
        self.moments = (SecondMoment(self.shared, optimizer, self.world, options.cross_term)
                        if options.debiases else None)
        self._sent_mark = (0, 0)  # bytes sent (parameters', trackers') when the last step's exchange started
        self.order: list[str] = []
        self.recording = True
        self.agreed = False  # whether `order` is every rank's (agreed at the first step())
        self.steps = 0
        self.log: list[dict[str, Any]] = []
        self.consensus: list[tuple[int, float]] = []
        self.mixing = describe(options.topology, self.world)
        self.released = False
        self.restored: dict[str, torch.Tensor] = {}
        self.restored_increments: dict[str, torch.Tensor] = {}
        self.t0 = time.perf_counter()
        self._hooks = [m.register_forward_pre_hook(functools.partial(self._pre_hook, name))
                       for name, m in module.named_modules()]
        if self.tracker is not None and self.tracker.overlap:
            self._hooks += [p.register_post_accumulate_grad_hook(functools.partial(self._grad_ready, k))
                            for k, (_, p) in enumerate(self.shared)]
        if self.moments is not None:
            self._hooks += self.moments.handles  # cross_term=halves: the first half's gradient

    # --- the user's loop ------------------------------------------------------------------
    def _pre_hook(self, name: str, _module: nn.Module, _args: Any) -> None:
        if self.released:
            raise CaramelError("strategy 'gossip': this model was shut down (caramel.shutdown()); parallelize it again")
        if self.recording and name not in self.order:
            self.order.append(name)
        self.exchange.before_module(name)

    def _agree_order(self) -> None:
        """One module order on every rank, for both exchanges' messages: each rank records the
        modules its own forwards ran before the first step(), and a module skipped on one rank
        (data-dependent control flow) would move every later tensor to another place in its
        messages, mixing one tensor into another. Rank 0's order, then the modules only
        other ranks ran, in rank order."""
        orders: list[list[str]] = [[] for _ in range(self.world)]
        dist.all_gather_object(orders, self.order, group=self.control)
        agreed: list[str] = []
        for order in orders:
            agreed += [m for m in order if m not in agreed]
        self.order, self.recording, self.agreed = agreed, False, True
        if self.tracker is not None:
            self.tracker.agreed = True

    def _grad_ready(self, k: int, _param: torch.Tensor) -> None:
        self.tracker.grad_ready(k)

    def _tracker_layout(self) -> tuple[Any, list]:
        """This step's neighbours and tracker messages (overlap_trackers): cut at
        tracker_bucket_cap_mb in reverse forward order (the agreed one), the order backward
        finishes the modules' gradients, so the last modules' trackers leave first."""
        W = self.matrices[self.steps % len(self.matrices)]
        owners = self._owners()
        y_owner = {id(y): owners[id(p)] for (_, p), y in zip(self.shared, self.tracker.y) if id(p) in owners}
        buckets = make_buckets(list(zip(self.tracker.names, self.tracker.y)), y_owner, self.order[::-1],
                               self.options.tracker_cap_mb * 2 ** 20)
        return neighbours(W, self.rank), buckets

    def before_update(self) -> float:
        """At optimizer.step(): mix what is still pending (all of it for algorithm=overlap,
        adam and overlap_momentum) and measure the consensus distance of the parameters this
        step's forward used."""
        t0 = time.perf_counter()
        wait0 = self.wait_s
        if not self.agreed:
            self._agree_order()
        for name, p in self.fixed:
            if p.grad is not None:
                raise CaramelError(f"strategy 'gossip': parameter {name!r} was frozen (requires_grad=False) at "
                                   "parallelize(), so it is not gossiped, and it has a gradient now; unfreeze it "
                                   "before parallelize()")
        due = self.options.consensus_every and self.steps % self.options.consensus_every == 0
        if self.options.mixes_at_update and due:
            self._measure_consensus()
        self.exchange.flush()
        if self.restored or self.restored_increments:  # a resumed worker's pending mix, from its checkpoint
            with torch.no_grad():
                for name, t in self._tensors():
                    if name in self.restored:
                        t.copy_(self.restored[name])
                    elif name in self.restored_increments:
                        t.add_(self.restored_increments[name])
            self.restored, self.restored_increments = {}, {}
        if self.tracker is not None:
            W = self.matrices[self.steps % len(self.matrices)]
            self.tracker.swap_in(neighbours(W, self.rank), self.options.bucket_cap_mb * 2 ** 20)
        if self.moments is not None:
            self.moments.observe()
            self.moments.set_up()
        if not self.options.mixes_at_update and due:
            self._measure_consensus()
        self.recording = False
        self._entry = {"step": self.steps, "start_s": t0 - self.t0}
        if self.consensus and self.consensus[-1][0] == self.steps:
            self._entry["consensus"] = self.consensus[-1][1]
        return self.wait_s - wait0

    @property
    def wait_s(self) -> float:
        """Time blocked on arrivals, in total (the parameters' and the trackers' exchanges)."""
        return self.exchange.wait_s + (self.tracker.exchange.wait_s if self.tracker else 0.0)

    @property
    def bytes_sent(self) -> int:
        """Bytes sent, in total, every peer counted."""
        return self.exchange.bytes_sent + (self.tracker.exchange.bytes_sent if self.tracker else 0)

    def head_step(self) -> bool:
        """Whether this step updates only the personalized head (DePRL's tau, `head_steps`):
        the first head_steps steps of every cycle of head_steps + 1."""
        tau = self.options.head_steps
        return bool(tau) and self.steps % (tau + 1) < tau

    def frozen(self) -> list[torch.Tensor]:
        """The parameters this step leaves alone: the body on a head step, the head on a body step
        (none without head_steps)."""
        if not self.options.head_steps:
            return []
        return [p for _, p in self.shared] if self.head_step() else list(self.local_params)

    def after_update(self, flush_wait_s: float) -> None:
        """After the user's optimizer applied the update: hand this step's parameters to the
        neighbours (not after a head-only step: the body did not change)."""
        if self.head_step():
            self._sent_mark = (self.exchange.bytes_sent, self._sent_mark[1])
            self._entry.update(flush_wait_s=flush_wait_s, wait_s=self.wait_s, peers=[], step_wait_s=0.0,
                               bytes_per_peer=0, head_only=True, end_s=time.perf_counter() - self.t0)
            self.log.append(self._entry)
            self.steps += 1
            return
        # one mix per cycle: a time-varying topology walks its matrices once per mix
        W = self.matrices[(self.steps // (self.options.head_steps + 1)) % len(self.matrices)]
        nb = neighbours(W, self.rank)
        self.exchange.set_buckets(make_buckets(self._tensors(), self._owners(), self.order,
                                               self.options.bucket_cap_mb * 2 ** 20))
        self.exchange.start(nb)
        # with this step's trackers (sent in backward or at step(), since the last exchange started)
        sent = (self.exchange.bytes_sent, self.tracker.exchange.bytes_sent if self.tracker else 0)
        per_peer = [(now - then) // max(len(nb.send), 1) for now, then in zip(sent, self._sent_mark)]
        self._sent_mark = sent
        prev = self.log[-1]["wait_s"] if self.log else 0.0
        self._entry.update(flush_wait_s=flush_wait_s, wait_s=self.wait_s, peers=list(nb.send),
                           step_wait_s=self.wait_s - prev, bytes_per_peer=sum(per_peer),
                           tracker_bytes_per_peer=per_peer[1], end_s=time.perf_counter() - self.t0)
        self.log.append(self._entry)
        self.steps += 1

    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        out = [(n, p) for n, p in self.shared] + [(n, b) for n, b in self.shared_buffers]
        if self.options.mixes_moments:
            for key in momentum_keys(self.optimizer):
                for n, p in self.shared:
                    buf = self.optimizer.state.get(p, {}).get(key)
                    if isinstance(buf, torch.Tensor):
                        out.append((n + ":" + key, buf))
        return out

    def _owners(self) -> dict[int, str]:
        """Each tensor's owning module: the first module (in forward order) holding it directly;
        for a module whose forward never ran, the first module that ran (the root). Such tensors
        are read by some other module (nn.MultiheadAttention reads its out_proj's; a model may
        read `dec.proj.weight` inside `enc`), and which one is not known: mixed at a later
        module's pre-hook they would change after their use and before backward (autograd
        refuses). Not the nearest ancestor that ran: `enc` may run before `dec`."""
        owner: dict[int, str] = {}
        mods = dict(self.module.named_modules())
        ran = set(self.order)
        first = self.order[0] if self.order else ""
        for name in self.order + [n for n in mods if n not in ran]:
            for t in list(mods[name]._parameters.values()) + list(mods[name]._buffers.values()):
                if t is not None:
                    owner.setdefault(id(t), name if name in ran else first)
        if self.options.mixes_moments:
            for key in momentum_keys(self.optimizer):
                for _, p in self.shared:
                    buf = self.optimizer.state.get(p, {}).get(key)
                    if isinstance(buf, torch.Tensor) and id(p) in owner:
                        owner[id(buf)] = owner[id(p)]
        return owner

    # --- metrics --------------------------------------------------------------------------
    def _measure_consensus(self) -> None:
        """Mean over workers of ||x_i - mean_j x_j||^2 over the gossiped parameters (two all-reduces)."""
        if not self.shared:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).to(torch.float64) for _, p in self.shared])
            mean = flat.clone()
            dist.all_reduce(mean, group=self.control)
            mean /= self.world
            d = ((flat - mean) ** 2).sum().reshape(1)
            dist.all_reduce(d, group=self.control)
        self.consensus.append((self.steps, float(d) / self.world))

    def averaged_module(self) -> nn.Module:
        """All ranks: a copy of the model holding the workers' average of every gossiped tensor
        (personalized ones stay this worker's own)."""
        self.synchronize()
        avg = copy.deepcopy(self.module, memo={id(self): self})  # the hooks' run is not copied...
        for m in avg.modules():
            m._forward_pre_hooks.clear()  # ...and the copy has none: it is not gossiped
        names = {n for n, _ in self.shared} | {n for n, _ in self.shared_buffers}
        with torch.no_grad():
            for n, t in list(avg.named_parameters()) + list(avg.named_buffers()):
                if n in names:
                    dist.all_reduce(t.data, group=self.control)
                    t.data /= self.world
        return avg

    def stats_dict(self) -> dict[str, Any]:
        """What reports show (cheap: `caramel train` reads it every step)."""
        last = self.log[-1] if self.log else {}
        return {"strategy": "gossip", "topology": self.mixing_name, "algorithm": self.options.algorithm,
                "steps": self.steps, "workers": self.world, "mixing": self.mixing,
                "personalized": self.local_names, "head_steps": self.options.head_steps, "consensus": self.consensus,
                "consensus_last": self.consensus[-1][1] if self.consensus else None,
                "bytes_per_peer_per_step": last.get("bytes_per_peer"), "peers_last_step": last.get("peers"),
                "tracker_bytes_per_peer_per_step": last.get("tracker_bytes_per_peer"),
                "tracker_messages_in_backward": self.tracker.sent_in_backward if self.tracker else 0,
                "bytes_sent": self.bytes_sent, "wait_s": self.wait_s,
                "last_wait_s": last.get("step_wait_s")}

    def write_trace(self) -> None:
        if not self.trace_path:
            return
        path = Path(self.trace_path)
        if self.world > 1:
            path = path.with_name(f"{path.stem}.rank{self.rank}{path.suffix or '.json'}")
        events = [TraceEvent(self.rank, "comm", "gossip", f"send to {x['peers']}", x["end_s"], 0.0, x["step"],
                             bytes=x["bytes_per_peer"] * len(x["peers"])) for x in self.log]
        Trace("measured", self.world, events, meta={"gossip": self.stats_dict(), "per_step": self.log}).save(path)

    # --- sync points, state ---------------------------------------------------------------
    def synchronize(self) -> None:
        """Every transfer landed. dpsgd/momentum: every pending mix applied (the next forward
        would apply it anyway). overlap, adam, overlap_momentum: nothing applied, the mix belongs
        to the next update, so evaluating or saving never changes the trajectory."""
        if self.released:
            return
        if self.exchange.mix_in_forward:
            self.exchange.flush()
        else:
            self.exchange.settle()
        self.write_trace()

    def worker_state(self) -> dict[str, Any]:
        """This worker's own model, optimizer, gossip step, module order, (overlap, adam,
        overlap_momentum) pending mix and (tracking) gradient tracker."""
        self.synchronize()
        by_id = self.exchange.pending_values()
        pending = {name: by_id[id(t)] for name, t in self._tensors()
                   if id(t) in by_id and id(t) not in self.exchange.increments}
        increments = {name: by_id[id(t)] for name, t in self._tensors()
                      if id(t) in by_id and id(t) in self.exchange.increments}
        pending.update(self.restored)
        increments.update(self.restored_increments)
        state = {"model": {k: v.detach().clone() for k, v in self.module.state_dict().items()},
                 "optimizer": self.optimizer.state_dict(), "steps": self.steps, "order": list(self.order),
                 "pending_mix": pending, "pending_increments": increments}
        if self.tracker is not None:
            state["tracker"] = self.tracker.state_dict()
        if self.moments is not None:
            state["second_moment"] = self.moments.state_dict()
        return state

    def load_worker_state(self, state: dict[str, Any]) -> None:
        """Resume this worker from `worker_state()` (call on every rank, before the next step)."""
        if self.exchange.pending or (self.tracker is not None and self.tracker.exchange.pending):
            raise CaramelError("strategy 'gossip': load a worker state right after parallelize(), before any step")
        if self.tracker is not None:
            if "tracker" not in state:
                raise CaramelError("strategy 'gossip': algorithm=tracking resumes each worker's gradient tracker, "
                                   "and this worker state has none (saved under another algorithm)")
            self.tracker.load_state_dict(state["tracker"])
        if self.moments is not None:
            if "second_moment" not in state:
                raise CaramelError("strategy 'gossip': second_moment=debiased resumes each worker's second-moment "
                                   "estimate, and this worker state has none (saved with second_moment=own)")
            self.moments.load_state_dict(state["second_moment"])
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps, self.order, self.recording = int(state["steps"]), list(state["order"]), False
        self.agreed = False  # agreed again at the next step(): the states may come from different runs
        if self.tracker is not None:
            self.tracker.agreed = False
        self.restored = dict(state["pending_mix"])
        self.restored_increments = dict(state.get("pending_increments", {}))

    def release(self) -> None:
        if self.released:
            return
        try:
            if all(group_alive(g) for g in (*self.groups, self.control)):
                self.exchange.flush()
                if self.tracker is not None:  # trackers a backward sent, with no step() after it
                    self.tracker.exchange.settle()
        finally:
            self.released = True
            for h in self._hooks:
                h.remove()
            for g in (*self.groups, self.control):
                with contextlib.suppress(Exception):
                    dist.destroy_process_group(g)


def momentum_keys(optimizer: torch.optim.Optimizer, algorithm: str = "momentum") -> tuple[str, ...]:
    """The optimizer-state entries algorithm=momentum (overlap_momentum, tracking_momentum) gossips with each parameter."""
    # the class name the profiler records for the simulator: both price by one name
    return keys_for(optimizer_class(optimizer), algorithm)
