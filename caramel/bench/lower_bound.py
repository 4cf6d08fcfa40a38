"""The simulator's lower bound on a configuration's step time, when the simulator provides one.

`caramel.sim.lower_bound` is written separately; until it exists (or when it cannot evaluate a
configuration, e.g. the bench ran on unshaped loopback so there is no bandwidth to model) the
bench reports no bound rather than a guess.
"""
from __future__ import annotations

import importlib
import sys

from caramel.bench.matrix import BenchConfig


def simulator_lower_bound():
    """`caramel.sim.lower_bound` if it is installed, else None."""
    try:
        sim = importlib.import_module("caramel.sim")
    except ImportError:
        return None
    fn = getattr(sim, "lower_bound", None)
    return fn if callable(fn) else None


def lower_bound_s(config: BenchConfig) -> float | None:
    """Predicted lower bound of the step time in seconds, or None (see module docstring)."""
    fn = simulator_lower_bound()
    if fn is None or config.bandwidth_bps is None:
        return None
    try:
        import caramel
        from caramel.cluster.spec import ClusterSpec
        from caramel.models.zoo import get_model

        kwargs = dict(config.model_options)
        if config.batch_size is not None:
            kwargs["batch_size"] = config.batch_size
        w = get_model(config.model)(seed=0, **kwargs)
        profile = caramel.profile_model(w.model, w.inputs, w.targets, w.loss_fn)
        value = fn(profile, ClusterSpec.uniform(config.workers, config.bandwidth_bps))
        return float(getattr(value, "step_time_s", value))
    except Exception as e:  # the bound is an extra; a mismatch with the simulator's API must not fail the bench
        print(f"caramel bench: no simulator lower bound for {config.label}: {type(e).__name__}: {e}", file=sys.stderr)
        return None
