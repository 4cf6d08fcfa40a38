"""`balance="dropout"`: a slow worker computes a narrower model instead of stalling the step.

Resource-aware structured dropout (DISTREAL). Each rank times its own compute per step (the
step's period minus its waits on communication, in the moving window of `balance="batch"`),
divided by the table's time ratio of the drop it ran, so the estimate is the full model's.
Every `balance_every` steps the ranks all-gather each window's median and spread and every
rank computes every rank's drop fraction alike (`caramel.strategies.caramel.dropout_rule`): a
rank s = t / min t times slower than the fastest, by more than `MIN_GAIN` and clearly beyond
the windows' noise, takes the table's entry (`DropoutTable.choose`), once two consecutive
decisions agree.

Which units rank r drops at step i is a seeded draw of (seed, i, r, group), so every rank
knows every rank's masks without communication. This rank runs narrow kernels on its kept
units (`caramel.profile.dropout_groups.Narrowing`); a dropped unit's gradient is zero there.
After a bucket's reduction each gradient entry is multiplied by world / (number of ranks that
computed it) (`Engine.reduce_fixup`): the sum each rank pre-divided by the world size becomes
the mean over only the ranks that kept the unit. Buckets keep their dense sizes, so plans and
the simulator's bytes do not change.

With nothing dropped anywhere the option stays out of the step: no masks are drawn, the
layers run their own forwards (the narrow ones are installed only while this rank drops) and
no reduced bucket is visited; what remains is the timing of each step and, every
`balance_every` steps, one all-gather of two numbers per rank.

The mask step, fractions, confirmation and window are checkpointed with the optimizer's state
dict (`caramel.strategies.caramel.balance_state`).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.dropout_groups import Group, Narrowing, find_groups
from caramel.profile.dropout_table import DropoutTable, random_kept
from caramel.profile.slowdown import set_compute_ratio
from caramel.strategies.caramel.balance import WINDOW_STEPS
from caramel.strategies.caramel.dropout_rule import MIN_GAIN, Confirmation, propose, window_stats
from caramel.topology.spec import ClusterSpec


def load_table(path: str | None, model: nn.Module) -> tuple[DropoutTable, list[Group]]:
    """The table option's file, checked against the model's droppable groups (rank-local: every
    rank gets the same error for the same input)."""
    if not path:
        raise CaramelError("balance='dropout' needs dropout_table=PATH, the model's cost-versus-accuracy table "
                           "(caramel profile --model MODEL --dropout-table PATH)")
    table = DropoutTable.load(path)
    groups = find_groups(model)
    table.check_groups([g.name for g in groups], where=f"dropout table {path}")
    return table, groups


def kept_units(seed: int, step: int, rank: int, group_index: int, units: int, fraction: float) -> torch.Tensor | None:
    """The units `rank` keeps of group `group_index` at `step` (None: all); the same on every rank."""
    key = hashlib.blake2b(f"{seed}:{step}:{rank}:{group_index}".encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(key, "little") & (2**63 - 1))
    return random_kept(units, fraction, gen)


class DropoutBalancer:
    """The drop fractions and masks of one engine's ranks (module docstring)."""

    runs_under_ddp = False  # DDP averages every entry over every rank; the drops need per-entry counts

    def __init__(self, engine: Any, model: nn.Module, group: Any, rank: int, world: int, every: int,
                 table: DropoutTable, groups: list[Group], seed: int = 0):
        self.engine, self.group, self.rank, self.world, self.every = engine, group, rank, world, every
        self.table, self.groups, self.seed = table, groups, seed
        self.narrowing = Narrowing(groups, install=False)  # installed while this rank drops
        self.confirmation = Confirmation()
        self.fractions = [0.0] * world
        self.times: collections.deque = collections.deque(maxlen=WINDOW_STEPS)
        self.changes: list[dict[str, Any]] = []
        self.step = 0
        index = {id(p): i for i, p in enumerate(engine.params)}
        self._layers = _layer_params(groups, index)
        self._current: dict[int, torch.Tensor] = {}  # param index -> multiplier, the step being computed
        self._reducing: dict[int, torch.Tensor] = {}  # the same, for the step whose buckets are reduced
        engine.add_listeners(backward_end=self._backward_end)
        # an emulated slow worker (caramel.profile.slowdown) scales its delay by this rank's drop
        set_compute_ratio(model, self.compute_ratio)
        self._draw()

    def detach(self) -> None:
        """The layers' own forwards back (at `caramel.shutdown()`); the fractions stay recorded."""
        self.narrowing.remove()
        self._current = {}

    def compute_ratio(self) -> float:
        """This rank's compute now against the full model's, from the table."""
        return self.table.ratio(self.fractions[self.rank])

    def set_fractions(self, fractions: list[float]) -> None:
        """Every rank's drop fraction from the next step drawn on (the same list on every rank)."""
        if len(fractions) != self.world or any(not 0.0 <= f < 1.0 for f in fractions):
            raise CaramelError(f"dropout fractions must be {self.world} numbers in [0, 1), got {fractions!r}")
        self.fractions = [float(f) for f in fractions]
        self._draw()

    def step_end(self, timed: bool = True) -> None:
        """After every reduced step: record this rank's full-model compute (unless not `timed`:
        a profiling step, or one holding a plan's adoption); every `every` steps,
        decide; draw the next step's masks."""
        stats = self.engine.stats
        if timed and stats.last_step_s is not None:  # None until a step has a period (a process's first has none)
            self.times.append(max(stats.last_step_s - stats.last_wait_s, 0.0) / self.compute_ratio())
        self.step += 1
        if self.every and self.step % self.every == 0 and self.world > 1:
            self._decide()
        self._draw()

    def _decide(self) -> None:
        # one all-gather of a small tensor (all_gather_object pickles and runs two collectives)
        nccl = dist.get_backend(self.group) == "nccl"
        device = self.engine.params[0].device if nccl and self.engine.params else torch.device("cpu")
        mine = torch.tensor(window_stats(self.times), dtype=torch.float64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        t0 = self.engine.recorder.now()
        dist.all_gather(gathered, mine, group=self.group)
        # read before the clock: on a GPU the all-gather only orders streams, the host blocks here
        stats = [(float(t[0]), float(t[1])) for t in gathered]
        # a faster rank blocks on the slow one (the step's reductions overlap the next forward, so
        # the ranks are not yet level): a wait, or its next compute time reads as the slow rank's
        # step and widens its window's spread
        self.engine.count_wait(self.engine.recorder.now() - t0)
        new = self.confirmation.confirm(propose(stats, self.table), self.fractions)
        if new is None:
            return
        # the balancer's own step count: the engine's restarts at 0 in a resumed run, this one is restored
        record = {"step": self.step, "fractions": new, "previous": list(self.fractions),
                  "compute_s": [m for m, _ in stats], "spread_s": [sd for _, sd in stats]}
        self.fractions = new
        self.changes.append(record)
        self.engine.stats.log("dropout_changes", record)

    def _draw(self) -> None:
        """This step's kept units on this rank, and the gradient multipliers of every rank's drops."""
        if not any(self.fractions):  # nothing dropped anywhere: the model's own forwards, nothing to fix up
            self.narrowing.set_kept({})
            self.narrowing.remove()
            self._current = {}
            return
        kept, masks = {}, {}
        for gi, g in enumerate(self.groups):
            per_rank = [kept_units(self.seed, self.step, r, gi, g.units, self.fractions[r]) for r in range(self.world)]
            kept[g.name] = per_rank[self.rank]
            if any(k is not None for k in per_rank):
                masks[g.name] = torch.stack([_indicator(k, g.units) for k in per_rank])  # world x units
        self.narrowing.set_kept(kept)
        if all(k is None for k in kept.values()):
            self.narrowing.remove()  # this rank drops nothing: its layers' own forwards
        else:
            self.narrowing.install()
        self._current = self._multipliers(masks) if masks else {}

    def _multipliers(self, masks: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        """world / (ranks that computed each entry), per parameter entry touched by a drop."""
        out = {}
        for m, (w_idx, b_idx, out_g, in_g, norm_idx) in self._layers.items():
            rows = masks.get(out_g.name) if out_g is not None else None
            cols = masks.get(in_g.name) if in_g is not None else None
            if cols is not None and in_g.spatial > 1:
                cols = cols.repeat_interleave(in_g.spatial, dim=1)
            if rows is not None and cols is not None:
                count = torch.einsum("ri,rj->ij", rows, cols)
            elif rows is not None:
                count = rows.sum(0)[:, None]
            elif cols is not None:
                count = cols.sum(0)[None, :]
            else:
                continue
            w = self.engine.params[w_idx]
            out[w_idx] = _mult(count.reshape(count.shape + (1,) * (w.dim() - 2)), self.world)
            if rows is not None:
                per_unit = _mult(rows.sum(0), self.world)
                for i in ([b_idx] if b_idx is not None else []) + norm_idx:
                    out[i] = per_unit
        return out

    def _backward_end(self) -> None:
        # the buckets reduced next are this step's: visit them only where some rank dropped
        self._reducing = self._current
        self.engine.reduce_fixup = self._fixup if self._reducing else None

    def _fixup(self, b: int) -> None:
        if not self._reducing:
            return
        fb = self.engine.buckets[b]
        for idx in fb.indices:
            mult = self._reducing.get(idx)
            if mult is not None:
                fb.grad_view(fb.local_slot[idx]).view(self.engine.params[idx].shape).mul_(mult)


def dropout_cluster(cluster: ClusterSpec, table: DropoutTable) -> ClusterSpec:
    """What `balance="dropout"` makes of uneven workers, for the simulator: a worker s times
    slower than the fastest (by more than `MIN_GAIN`) computes at speed / the time ratio of the
    entry `table` picks for s, as `DropoutBalancer` would choose (bytes reduced do not change)."""
    fastest = max(w.speed for w in cluster.workers)
    workers = []
    for w in cluster.workers:
        s = fastest / w.speed
        ratio = table.choose(s).time_ratio if s > 1.0 + MIN_GAIN else 1.0
        workers.append(dataclasses.replace(w, speed=w.speed / ratio))
    return dataclasses.replace(cluster, workers=workers)


def _indicator(kept: torch.Tensor | None, units: int) -> torch.Tensor:
    if kept is None:
        return torch.ones(units)
    return torch.zeros(units).index_fill_(0, kept, 1.0)


def _mult(count: torch.Tensor, world: int) -> torch.Tensor:
    # where no rank computed an entry its reduced gradient is 0 already; any factor keeps it 0
    return world / count.clamp(min=1.0)


def _layer_params(groups: list[Group], index: dict[int, int]) -> dict[int, tuple]:
    """Per layer a group touches: (weight, bias, group of its outputs, group of its inputs,
    that output group's BatchNorm parameters), as parameter indices of the engine."""
    layers: dict[int, list] = {}
    for g in groups:
        for m, role in ((g.producer, 2), (g.consumer, 3)):
            entry = layers.setdefault(id(m), [index[id(m.weight)], index.get(id(m.bias)) if m.bias is not None else None,
                                               None, None, []])
            entry[role] = g
        layers[id(g.producer)][4] = [index[id(p)] for n in g.norms for p in (n.weight, n.bias) if p is not None]
    return {k: tuple(v) for k, v in layers.items()}
