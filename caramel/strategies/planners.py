"""Run any registered planner by name: the built-ins (`fifo`, `fusion`) and each strategy's own.

Importing this module registers every planner, so a name is found whichever module asked first.
"""
from __future__ import annotations

from typing import Any

import caramel.strategies.caramel.planner  # noqa: F401 (registers "caramel")
from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.plan.planners import PLANNERS
from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec


def make_plan(planner: str, profile: ModelProfile, cluster: ClusterSpec | None = None,
              world_size: int | None = None, **options: Any) -> Plan:
    """Run a registered planner by name."""
    if planner not in PLANNERS:
        raise CaramelError(f"unknown planner {planner!r}; expected one of {', '.join(sorted(PLANNERS))}")
    if not profile.trainable():
        raise CaramelError(f"model {profile.model!r} has no trainable parameters; there is nothing to reduce")
    return PLANNERS[planner](profile, cluster, world_size=world_size, **options)


def planner_names() -> list[str]:
    """Every registered planner's name, built-ins included, sorted."""
    return sorted(PLANNERS)
