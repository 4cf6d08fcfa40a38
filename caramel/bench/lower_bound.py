"""The simulator's lower bound on a configuration's step time, from what the bench measured.

`caramel.sim.lower_bound(profile, cluster)` gives the best step time any schedule could reach
for a model's transfer windows on a cluster. The bench feeds it numbers from the same job so
that the bound is comparable with the measured step times:

- the profile is taken on every worker side by side after the measured rounds (so compute
  runs under the same contention for cores as the strategies did);
- the link rate is the *effective* one the comm-only baseline achieved (ring all-reduce:
  T_comm = 2(n-1)/n * S / B), not the nominal tc rate, since TCP over a shaped link reaches less.

When the simulator or the profiler is missing, or there is no communication (one worker),
the bench reports no bound rather than a guess.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

from caramel.models.zoo import ModelBatch


def _caramel_attr(module: str, name: str):
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    fn = getattr(mod, name, None)
    return fn if callable(fn) else None


def profile_workload(w: ModelBatch, steps: int = 3, small_batch_size: int | None = None) -> Any | None:
    """A ModelProfile of `w` (a throwaway copy: profiling trains it), or None without a profiler;
    `small_batch_size`: its modules timed at that batch too (`profile_model`)."""
    profile_model = _caramel_attr("caramel", "profile_model")
    if profile_model is None:
        return None
    try:
        return profile_model(w.model, w.inputs, w.targets, w.loss_fn, steps=steps, small_batch_size=small_batch_size)
    except Exception as e:  # the bound is an extra; it must never fail the bench
        print(f"[bench] no profile for the lower bound: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def effective_bandwidth_bps(grad_bytes: int, workers: int, comm_s: float) -> float | None:
    """The per-link rate B at which a ring all-reduce of `grad_bytes` takes `comm_s` seconds."""
    if workers < 2 or comm_s <= 0 or grad_bytes <= 0:
        return None
    return 2 * (workers - 1) / workers * grad_bytes * 8 / comm_s


def lower_bound_s(profile: Any | None, workers: int, grad_bytes: int, comm_s: float,
                  overlap: str = "forward") -> float | None:
    """Predicted lower bound of the step time in seconds, or None (see module docstring)."""
    bound = _caramel_attr("caramel.sim", "lower_bound")
    bandwidth_bps = effective_bandwidth_bps(grad_bytes, workers, comm_s)
    if bound is None or profile is None or bandwidth_bps is None:
        return None
    try:
        from caramel.topology.spec import ClusterSpec

        value = bound(profile, ClusterSpec.uniform(workers, bandwidth_bps, latency_s=0.0), overlap=overlap)
        return float(getattr(value, "step_time_s", value))
    except Exception as e:  # a mismatch with the simulator's API must not fail the bench
        print(f"[bench] no simulator lower bound: {type(e).__name__}: {e}", file=sys.stderr)
        return None
