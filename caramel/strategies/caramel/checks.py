"""Periodic checks: every `check_every` steps all ranks agree on the plan, the step count, the
forward's module order and (with `replan="auto"`) the link's bandwidth, in one small all-reduce.

Disagreeing plans or step counts are an error on every rank (they would average mismatched
gradients). A changed module order leaves updates correct (each module applies what it uses)
but the plan's priorities stale: the controller profiles again, at most `MAX_ORDER_REPLANS`
times. A bandwidth more than 2x off what the plan assumed makes it re-plan for the measured one.
Every rank reaches the same verdict at the same step, from the same reduced numbers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from caramel.distributed import collective_device
from caramel.errors import MismatchError
from caramel.runtime.engine import Engine
from caramel.topology.spec import ClusterSpec

MAX_ORDER_REPLANS = 2
REPLAN_CHECK_EVERY = 10  # at most this many steps between checks with replan="auto"


@dataclass(frozen=True)
class Verdict:
    """What the ranks agreed on: some rank saw a changed module order; the best measured bandwidth."""

    order_changed: bool
    measured_bps: float | None


class PeriodicCheck:
    def __init__(self, engine: Engine, group, rank: int, world: int, check_every: int, replan: str):
        self.engine, self.group, self.rank, self.world = engine, group, rank, world
        self.replan = replan
        self.check_every = check_every
        if replan == "auto":
            # the engine times its collectives; agreement on a new bandwidth is checked often
            engine.start_measuring()
            self.check_every = min(check_every or REPLAN_CHECK_EVERY, REPLAN_CHECK_EVERY)
        self.order_replans = 0

    def due(self, step: int) -> bool:
        return bool(self.check_every) and step % self.check_every == 0

    def may_reprofile(self) -> bool:
        """One more re-profile for a changed order is allowed (and counted)."""
        if self.order_replans >= MAX_ORDER_REPLANS:
            return False
        self.order_replans += 1
        return True

    def agree(self, plan_cluster: ClusterSpec | None) -> Verdict:
        """The all-reduce (MAX) of the plan fingerprint and its negation, the step count and its
        negation, the order flag and the bandwidth; raises on a disagreement."""
        engine = self.engine
        h = int(engine.plan.fingerprint[:12], 16)
        bw = None
        if self.replan == "auto" and plan_cluster is not None:
            bw = engine.measured_bandwidth_bps(plan_cluster.latency_s, plan_cluster.effective_queued_latency_s)
        calls = engine.step_calls
        t = torch.tensor([h, -h, int(engine.take_order_changed()), int(bw // 1000) if bw else 0, calls, -calls],
                         dtype=torch.int64)
        if self.world > 1:
            try:
                t = t.to(collective_device(self.group))
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            except Exception as e:  # noqa: BLE001 - re-raised with context
                raise RuntimeError(f"caramel: rank {self.rank}: all-reduce of the plan check (step {engine.stats.step}) "
                                   f"failed: {e}. A peer may have died or hung (timeout {engine.timeout_s:g} s)") from e
        t = t.tolist()
        if t[4] != calls or -t[5] != calls:
            raise MismatchError(f"rank {self.rank}: ranks disagree on the step: this rank has made {calls} optimizer.step() "
                                f"calls, another rank between {-t[5]} and {t[4]}; a rank skipped or added a gradient "
                                "reduction (no_sync or a backward on some ranks only), so gradients of different steps were averaged")
        if t[0] != h or -t[1] != h:
            raise MismatchError(f"rank {self.rank}: ranks disagree on the plan at step {engine.stats.step} "
                                f"(this rank's fingerprint {engine.plan.fingerprint}); they would reduce mismatched gradients")
        return Verdict(bool(t[2]), float(t[3]) * 1000 if t[3] > 0 else None)


def bandwidth_replan_cluster(plan_cluster: ClusterSpec, measured_bps: float, step: int) -> ClusterSpec | None:
    """`replan="auto"`: the cluster to plan for when the measured bandwidth (the best rank's,
    the same on every rank) differs from what the plan assumed by more than 2x, else None."""
    ratio = measured_bps / plan_cluster.bandwidth_bps
    if 0.5 <= ratio <= 2.0:
        return None
    return dataclasses.replace(plan_cluster, bandwidth_bps=measured_bps,
                               meta=dict(plan_cluster.meta, measured_at_step=step))


def check_same_plan(fingerprint: str, group, world: int) -> None:
    """Every rank's plan `fingerprint` is the same (at an adoption), else `MismatchError` naming each."""
    if world == 1:
        return
    prints: list[Any] = [None] * world
    dist.all_gather_object(prints, fingerprint, group=group)
    if len(set(prints)) != 1:
        raise MismatchError("ranks hold different plans: fingerprints " + ", ".join(f"rank {r}: {f}" for r, f in enumerate(prints)))
