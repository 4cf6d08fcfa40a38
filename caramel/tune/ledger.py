"""Real measurements taken in advance, charged to each search method as it asks for them.

`caramel tune --measure real` measures every candidate of the knob space in one bench job,
interleaved in rounds (so drift and host load hit every candidate alike), and every search
method then reads its answers from that table. A method is charged, in real training steps,
for each distinct candidate it asks for, the first time it asks: the steps that candidate's
measurement cost in the job (warm-up, settling and the measured rounds). The methods thus see
identical noise, and what one spends is what measuring its candidates alone would have cost.

`evaluate` turns a method's trials into what the issue's targets are stated in: real steps
spent, the best measured step, its gap to the sweep's best, and the steps it took to first
measure a candidate within `tolerance` of that best.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from caramel.errors import CaramelError
from caramel.tune.space import Config, Space


@dataclass(frozen=True)
class Measured:
    """One candidate's measurement: its median step and the real steps measuring it cost."""

    step_s: float
    steps: int  # training steps every worker ran for it (the engine's own step count)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise CaramelError(f"a measured step must be a positive number of seconds, got {self.step_s!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise CaramelError(f"a measurement costs a positive whole number of steps, got {self.steps!r}")


@dataclass
class Ledger:
    """One method's account: `measure(config)` answers from the table and charges the first query
    of each candidate; a repeated query is free (the method already holds that measurement)."""

    space: Space
    table: dict[tuple, Measured]
    overhead_steps: int = 0  # steps a method spends besides measurements (the tuner's profiling)
    order: list[tuple] = field(default_factory=list)  # distinct candidates, in the order first asked

    def measure(self, config: Config) -> float:
        key = self.space.key(config)
        if key not in self.table:
            raise CaramelError(f"candidate {config} was not measured in the sweep; the table holds {len(self.table)} "
                               "candidates of the same knob space")
        if key not in self.order:
            self.order.append(key)
        return self.table[key].step_s

    @property
    def measurements(self) -> int:
        return len(self.order)

    @property
    def steps_used(self) -> int:
        return self.overhead_steps + sum(self.table[k].steps for k in self.order)

    def steps_after(self, n: int) -> int:
        """Real steps spent once the first `n` distinct candidates were measured."""
        return self.overhead_steps + sum(self.table[k].steps for k in self.order[:n])


@dataclass(frozen=True)
class MeasuredTable:
    """The sweep: every candidate of `space` measured once (see the module docstring)."""

    space: Space
    table: dict[tuple, Measured]

    def __post_init__(self) -> None:
        missing = [c for c in self.space.candidates() if self.space.key(c) not in self.table]
        if missing:
            raise CaramelError(f"the sweep lacks {len(missing)} candidate(s) of the knob space, e.g. {missing[0]}")

    def ledger(self, overhead_steps: int = 0) -> Ledger:
        return Ledger(self.space, self.table, overhead_steps)

    @property
    def sweep_steps(self) -> int:
        return sum(m.steps for m in self.table.values())

    @property
    def best(self) -> tuple[Config, Measured]:
        key = min(self.table, key=lambda k: self.table[k].step_s)
        return dict(zip((k.name for k in self.space.knobs), key)), self.table[key]


@dataclass(frozen=True)
class Outcome:
    """What one run of one method achieved, in the targets' terms."""

    method: str
    seed: int
    measurements: int
    steps_used: int
    best_s: float
    gap: float  # best_s / the sweep's best - 1
    steps_to_reach: int | None  # real steps until it first measured within tolerance (None: never)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "seed": self.seed, "measurements": self.measurements,
                "steps_used": self.steps_used, "best_s": self.best_s, "gap": self.gap,
                "steps_to_reach": self.steps_to_reach}


def evaluate(method: str, seed: int, ledger: Ledger, sweep: MeasuredTable, tolerance: float = 0.02) -> Outcome:
    """The ledger's run against the sweep's best: a candidate counts as reached when its measured
    step is at most (1 + tolerance) times the best."""
    if not ledger.order:
        raise CaramelError(f"method {method!r} measured nothing; give it a budget of at least one measurement")
    best_s = sweep.best[1].step_s
    target = best_s * (1 + tolerance)
    times = [ledger.table[k].step_s for k in ledger.order]
    reach = next((i for i, t in enumerate(times, 1) if t <= target), None)
    return Outcome(method, seed, ledger.measurements, ledger.steps_used, min(times), min(times) / best_s - 1,
                   ledger.steps_after(reach) if reach is not None else None)
