"""The Caramel strategy's knobs: how it plans, when updates apply, how it chooses and checks.

`parallelize(model, optimizer, overlap="forward")` and `--strategy caramel:overlap=forward`
both build a `CaramelOptions`; a misspelled name is an error that names the nearest option.
Planner knobs belong to one planner each; setting one the chosen planner does not take is an
error too, rather than a knob that silently does nothing.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from typing import Any

from caramel.errors import CaramelError
from caramel.plan.branch_order import BRANCH_ORDER_MODES, check_branch_order
from caramel.plan.compute_schedule import check_compute_schedule
from caramel.plan.plan import OVERLAPS
from caramel.plan.planners import PLANNERS
from caramel.strategies.planners import planner_names  # noqa: F401 (registers every planner in PLANNERS)
from caramel.runtime.comm_priority import COMM_PRIORITIES
from caramel.strategies.caramel.adaptive_compression import check_compression
from caramel.strategies.caramel.trial import DEFAULT_TRIAL_PASSES, DEFAULT_TRIAL_STEPS

# arguments every planner gets from the strategy itself, never from the user
_PLANNER_INPUTS = ("profile", "cluster", "world_size", "overlap")


@dataclass(frozen=True)
class CaramelOptions:
    """Defaults are what `caramel.parallelize(model, optimizer)` runs; see README for each."""

    planner: str = "caramel"
    overlap: str = field(default="auto", metadata={"choices": ("auto",) + OVERLAPS})
    trial_steps: int = DEFAULT_TRIAL_STEPS
    trial_passes: int = DEFAULT_TRIAL_PASSES
    profile_steps: int = 2
    check_every: int = 100
    replan: str = field(default="off", metadata={"choices": ("off", "auto")})
    comm_priority: str = field(default="auto", metadata={"choices": COMM_PRIORITIES})
    split_tied: bool = True
    # the dense layers filling the plan's first collective compute their weight gradient before
    # their input gradient, so that collective starts sooner (`caramel.profile.split_backward`)
    early_weight_grad: bool = True
    # planner knobs (None: the planner's own default); each is checked against the planner
    bucket_cap_mb: float | None = None
    first_bucket_mb: float | None = None
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    comm_model: str | None = field(default=None, metadata={"choices": ("message", "closed")})
    input_spread: float | None = None
    contention_spread: float | None = None
    collective_cpu_s: float | None = None
    # deferred weight gradients (`caramel.plan.compute_schedule`): "auto" (the planner decides,
    # k = 0 included; fifo and fusion defer nothing), "off", or k (forced: the k splittable
    # modules nearest the input, for tests and benchmarks); every planner takes it
    compute_schedule: str | int = "auto"
    # the cap on what "auto" may defer: extra bytes kept alive, as a share of the undeferred peak
    # (None: 0.1); caramel planner only
    defer_memory_fraction: float | None = None
    # independent branches (`caramel.plan.branch_order`): "auto" lets the caramel planner run them
    # in the order their updates arrive when simulation says that is faster; "off" keeps the model's
    branch_order: str = field(default="off", metadata={"choices": BRANCH_ORDER_MODES})
    # gradient codec for every bucket (none or off, fp16, bf16, topk:FRACTION, powersgd:RANK), or "auto":
    # per bucket, from the measured link and the simulator (`adaptive_compression`)
    compression: str = "none"
    # "batch": per-rank shares of the global batch follow measured speed (`balance`); "dropout":
    # a slow rank drops a fraction of units, chosen from `dropout_table` (`dropout`); decided
    # every `balance_every` steps (0: never; the shares the sampler starts with stay, nothing dropped)
    balance: str = field(default="off", metadata={"choices": ("off", "batch", "dropout")})
    balance_every: int = 10
    # balance="dropout": the model's caramel.dropout-table/1 JSON (caramel profile --dropout-table)
    dropout_table: str | None = None

    def __post_init__(self) -> None:
        if self.compression == "off":  # the issue's spelling of "none"
            object.__setattr__(self, "compression", "none")
        check_compression(self.compression)
        if self.dropout_table is not None and self.balance != "dropout":
            raise CaramelError(f"dropout_table is for balance='dropout', not balance={self.balance!r}")
        if self.balance == "dropout" and not self.dropout_table:
            raise CaramelError("balance='dropout' needs dropout_table=PATH, the model's cost-versus-accuracy table "
                               "(caramel profile --model MODEL --dropout-table PATH)")
        if self.balance_every < 0:
            raise CaramelError(f"balance_every must be a whole number of steps >= 0, got {self.balance_every!r}")
        if self.planner not in PLANNERS:
            from caramel.strategies.options import unknown_name_error
            raise unknown_name_error("planner", self.planner, sorted(PLANNERS))
        if self.trial_steps < 2:
            raise CaramelError(f"trial_steps must be an integer >= 2 (one transition step and at least one timed "
                               f"step per overlap mode), got {self.trial_steps!r}")
        if self.trial_passes < 1:
            raise CaramelError(f"trial_passes must be an integer >= 1 (the most passes an undecided overlap trial "
                               f"runs), got {self.trial_passes!r}")
        if self.profile_steps < 1:
            raise CaramelError(f"profile_steps must be >= 1, got {self.profile_steps}")
        if self.check_every < 0:
            raise CaramelError(f"check_every must be a whole number of steps >= 0, got {self.check_every!r}")
        check_compute_schedule(self.compute_schedule)
        f = self.defer_memory_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not f >= 0):
            raise CaramelError(f"defer_memory_fraction must be a number >= 0 (extra bytes deferred weight gradients "
                               f"may keep alive, as a share of the undeferred peak), got {f!r}")
        check_branch_order(self.branch_order)
        takes = planner_knobs(self.planner)
        for name, value in self.planner_options().items():
            if name not in takes:
                owners = [p for p in sorted(PLANNERS) if name in planner_knobs(p)]
                raise CaramelError(f"option {name} is for planner {' or '.join(owners)}, not {self.planner!r}; planner "
                                   f"{self.planner!r} takes {', '.join(sorted(takes)) or 'no options'}")

    def planner_options(self) -> dict[str, Any]:
        """The planner knobs that were set, as keywords for `make_plan` (`compute_schedule` when
        not "auto", every planner's default)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in PLANNER_KNOBS and getattr(self, f.name) is not None
                and not (f.name == "compute_schedule" and self.compute_schedule == "auto")
                and not (f.name == "branch_order" and self.branch_order == "off")}


PLANNER_KNOBS = ("bucket_cap_mb", "first_bucket_mb", "fusion_threshold_mb", "cycle_time_ms", "comm_model",
                 "input_spread", "contention_spread", "collective_cpu_s", "compute_schedule",
                 "defer_memory_fraction", "branch_order")


def planner_knobs(planner: str) -> set[str]:
    """The keyword options a registered planner's function takes (its signature is the truth)."""
    params = inspect.signature(PLANNERS[planner]).parameters.values()
    return {p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
            if p.name not in _PLANNER_INPUTS}
