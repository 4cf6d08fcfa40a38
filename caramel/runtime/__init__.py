"""What strategies share at run time: buckets, gradient hooks, lazy updates, buffer and tied-row
sync, communication-thread priority. The strategies compose these (`caramel.strategies`)."""
from __future__ import annotations

from typing import Any


def schedule_settled(optimizer: Any) -> bool:
    """True once the engine behind `optimizer` has settled on its schedule: online profiling and
    any overlap trial are over (they end at the same step on every rank). It stays True until a
    re-plan (a changed module order, `replan="auto"`) starts a new profile or trial. Asks the
    engine's controller (`caramel.runtime.engine.Controller`), so it is here, beside the engine,
    for any strategy that drives one."""
    from caramel.errors import CaramelError

    engine = getattr(optimizer, "_caramel_engine", None)
    if engine is None:
        raise CaramelError("schedule_settled: the optimizer is not one that caramel.parallelize returned")
    return engine.controller is None or engine.controller.settled()
