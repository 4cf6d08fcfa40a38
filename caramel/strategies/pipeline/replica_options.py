"""The options the runtime builds a replicated stage's Caramel engine with.

This is the runtime's setting (`replica_reduce.caramel_replicas` builds each stage's engine from
it); the pipeline simulator imports it (`planner_buckets.replica_plan`) so that it plans a stage's
buckets as the engine does. Changing it changes training, not only the simulator's buckets:
`tests/strategies/pipeline/test_replica_options.py` pins the values.
"""
from __future__ import annotations

from caramel.strategies.caramel.options import CaramelOptions


def replica_engine_options() -> CaramelOptions:
    """Lazy updates before the next forward, no checks, trials or split layers: a stage runs
    several microbatches' forwards before their backwards, and the engine's applied updates
    would change the weights split layers saved for their backward."""
    return CaramelOptions(overlap="forward", check_every=0, split_tied=False, compute_schedule="off",
                          early_weight_grad=False)
