"""The tuner's objectives for a model on a cluster: a cheap model and a measurement.

`predict` plans the candidate and simulates it with closed-form collectives (fast, no link
sharing); `measure` simulates the same plan with message-level collectives, link sharing and
CPU contention (`compute_slowdown`), the simulator's most detailed model. `caramel tune
--measure real` keeps `predict` and puts real training steps in the `measure` slot instead
(`caramel.tune.ledger`; the command layer runs them).

A candidate's `overlap` knob goes to the simulator, every other knob to the planner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim.collectives import CommModel
from caramel.sim.simulate import simulate
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec
from caramel.tune.space import Config


@dataclass
class SimulatorObjective:
    profile: ModelProfile
    cluster: ClusterSpec
    planner: str = "fifo"
    compute_slowdown: float = 1.2
    iterations: int = 4
    measured: int = field(default=0, init=False)  # calls to `measure`, the expensive side

    def __post_init__(self) -> None:
        self._comm = {kind: CommModel(self.cluster, kind) for kind in ("closed", "message")}

    def plan(self, config: Config, comm_model: str = "message") -> tuple[Plan, str]:
        knobs: dict[str, Any] = {k: v for k, v in config.items() if k != "overlap"}
        overlap = config.get("overlap", "forward")
        return make_plan(self.planner, self.profile, self.cluster, overlap=overlap, comm_model=comm_model, **knobs), overlap

    def predict(self, config: Config) -> float:
        plan, overlap = self.plan(config, "closed")
        return simulate(self.profile, self.cluster, plan, overlap=overlap, iterations=self.iterations, trace=False,
                        comm=self._comm["closed"]).step_time_s

    def measure(self, config: Config) -> float:
        self.measured += 1
        plan, overlap = self.plan(config, "message")
        return simulate(self.profile, self.cluster, plan, overlap=overlap, iterations=self.iterations, trace=False,
                        comm=self._comm["message"], compute_slowdown=self.compute_slowdown).step_time_s
