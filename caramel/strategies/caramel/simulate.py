"""The `caramel` strategy in the simulator: the planner's plan, replayed in the overlap mode it runs.

With `overlap="auto"` the runtime times the planner's forward and backward plans and keeps the
faster; the simulator predicts both and reports the faster, the same choice made on predictions.
The plan carries the codecs the `compression` option picks (`adaptive_compression`), so their
wire bytes and compute are in the prediction. With `balance="batch"` uneven workers run at their
mean speed (`balance.balanced_cluster`: shares proportional to speed); with `balance="dropout"`
each slower worker's compute is scaled by the time ratio of the entry its table picks for it
(`dropout.dropout_cluster`).
"""
from __future__ import annotations

from caramel.profile.model_profile import ModelProfile
from caramel.sim.simulate import SimResult, simulate
from caramel.strategies.caramel.adaptive_compression import compress_plan
from caramel.profile.dropout_table import DropoutTable
from caramel.strategies.caramel.balance import balanced_cluster
from caramel.strategies.caramel.dropout import dropout_cluster
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.caramel.trial import AUTO_CANDIDATES
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec


def simulate_caramel(profile: ModelProfile, cluster: ClusterSpec, options: CaramelOptions,
                     iterations: int = 4) -> SimResult:
    modes = AUTO_CANDIDATES if options.overlap == "auto" else (options.overlap,)
    if options.balance == "batch":
        cluster = balanced_cluster(cluster)
    elif options.balance == "dropout":
        cluster = dropout_cluster(cluster, DropoutTable.load(options.dropout_table))
    results = []
    for mode in modes:
        plan = make_plan(options.planner, profile, cluster, overlap=mode, **options.planner_options())
        plan = compress_plan(plan, options.compression, profile, cluster, mode)
        results.append(simulate(profile, cluster, plan, overlap=mode, iterations=iterations))
    return min(results, key=lambda r: r.step_time_s)
