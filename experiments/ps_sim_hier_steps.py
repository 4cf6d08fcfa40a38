"""Hierarchical ps step times the simulator predicts, per backend (docs/ps.md, "The leaders'
node sums in the simulator"): bsp, the synthetic 12-layer profile and two-workers-a-node
clusters of `tests/strategies/ps/test_simulate_links.py`, on gloo (each leader's node sum sent
to the server leader as it lands) and on NCCL (the collective among the leaders). Untimed.

    PYTHONPATH=. python experiments/ps_sim_hier_steps.py
"""
from __future__ import annotations

import argparse

from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.topology.spec import ClusterSpec

# (nodes, workers a node, between nodes bit/s, within a node bit/s, strategy spec)
CASES = [(2, 2, 1e8, 1e10, "ps:hierarchical=true"), (3, 2, 3e8, 1e10, "ps:hierarchical=true,order=random"),
         (4, 2, 1e8, 2e8, "ps:hierarchical=true"), (4, 3, 3e8, 1e10, "ps:hierarchical=true,order=tic")]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # no options: --help, and refuse unknown ones
    profile = synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                                backward_time_s=0.04, optimizer_time_s=0.002)
    print(f"{'nodes':>5} {'local':>5} {'between':>8} {'within':>8}  {'spec':36} {'nccl_s':>8} {'gloo_s':>8}")
    for nodes, local, rate_bps, node_bps, spec in CASES:
        steps = []
        for backend in ("nccl", "gloo"):
            cluster = ClusterSpec.uniform(nodes * local, rate_bps)
            cluster.meta.update(workers_per_node=local, node_bandwidth_bps=node_bps, backend=backend)
            steps.append(STRATEGIES.spec(spec).simulate(profile, cluster).step_time_s)
        print(f"{nodes:5d} {local:5d} {rate_bps / 1e6:7.0f}M {node_bps / 1e6:7.0f}M  {spec:36} "
              f"{steps[0]:8.4f} {steps[1]:8.4f}")


if __name__ == "__main__":
    main()
