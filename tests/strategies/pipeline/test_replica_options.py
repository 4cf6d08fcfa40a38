"""The replicas' engine options are the runtime's (pinned here)."""
from __future__ import annotations

from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.pipeline.replica_options import replica_engine_options


def test_the_replica_engine_options_are_the_runtimes_literal_values():
    # the RUNTIME's setting (replica_reduce.caramel_replicas builds each stage's engine from it):
    # early weight gradients or split layers would break training under microbatching, so a
    # change here must be a deliberate change of this test, not a tuning of the simulator
    assert replica_engine_options() == CaramelOptions(overlap="forward", check_every=0, split_tied=False,
                                                      compute_schedule="off", early_weight_grad=False)
    # replica_plan mirrors the controller's call without its compression step: that holds only
    # while the replicas' engine compresses nothing
    assert replica_engine_options().compression == "none"
