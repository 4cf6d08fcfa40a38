"""How large the ps simulator's two shared-link approximations get, on the synthetic 12-layer
model of the tests (`tests/strategies/ps/test_simulate_links.py`), flat colocated servers,
then the hierarchical step (2 nodes of 2 workers, 10 Gbit/s within a node, as the tests' `hier`).

- Uneven shards: the long-run bound adds a rank's pulls to the pushes to the busiest other
  server, as if that server's receives were the rank's sends. The NIC itself carries, per
  step, every other shard's gradient once and its own shard to every other rank: the whole
  model plus (n-2) x its shard. Printed: the step against that busiest egress.
- Hierarchical: a leader's inter-node pushes and pulls queue on its one NIC. Printed: the step
  against the whole model through a leader's NIC (its node's sum of the other shard out, its
  own shard to the other leader).
- Granularity: a push waits for every pull its senders handed over before it; the runtime's
  sender thread hands pulls over one bucket at a time, so there a push waits behind at most
  one pull bucket. Printed: the longest steady wait `Links.push_start` adds against the
  longest pull bucket of the recorded step.

Nothing fitted, nothing written: it prints one line per case.

    PYTHONPATH=. python experiments/ps_sim_links_sizes.py
"""
from __future__ import annotations

import sys
from unittest import mock

from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.ps import sim_links
from caramel.topology.spec import ClusterSpec


def case(profile, spec: str, workers: int, rate_bps: float) -> str:
    waits_s: list[float] = []
    original = sim_links.Links.push_start

    def recording(self, start_s, owner, pulls_end):
        t = original(self, start_s, owner, pulls_end)
        waits_s.append(t - start_s)
        return t

    with mock.patch.object(sim_links.Links, "push_start", recording):
        r = STRATEGIES.spec(spec).simulate(profile, ClusterSpec.uniform(workers, rate_bps))
    total = sum(p.bytes for p in profile.trainable())
    egress_s = max(total + (workers - 2) * s["bytes"] for s in r.meta["shard_loads"]) * 8 / rate_bps
    tl = r.meta["timeline_s"]
    bucket_s = max(z - a for _, _, a, z in tl["pulls_before"] + tl["pulls_after"])
    steady = waits_s[len(waits_s) // 2:]
    # where the step is the compute (the links idle part of it), the egress comparison says nothing
    bound = "comm" if r.step_time_s > 1.1 * r.compute_time_s else "compute"
    return (f"[{bound}-bound] {spec} x{workers} @ {rate_bps / 1e6:g} Mbit/s: step {1e3 * r.step_time_s:.1f} ms, busiest egress "
            f"{1e3 * egress_s:.1f} ms ({100 * (r.step_time_s / egress_s - 1):+.1f}%); push waits behind pulls up to "
            f"{1e3 * max(steady):.1f} ms, longest pull bucket {1e3 * bucket_s:.1f} ms")


def hierarchical_case(profile, spec: str, rate_bps: float) -> str:
    """2 nodes of 2 workers: each leader sends one node sum and one pull of a shard a step."""
    cluster = ClusterSpec.uniform(4, rate_bps)
    cluster.meta.update(workers_per_node=2, node_bandwidth_bps=1e10)
    r = STRATEGIES.spec(spec + ",hierarchical=true").simulate(profile, cluster)
    nic_s = sum(p.bytes for p in profile.trainable()) * 8 / rate_bps
    bound = "comm" if r.step_time_s > 1.1 * r.compute_time_s else "compute"
    return (f"[{bound}-bound] {spec},hierarchical=true 2 nodes x2 @ {rate_bps / 1e6:g} Mbit/s: step "
            f"{1e3 * r.step_time_s:.1f} ms, whole model through a leader's NIC {1e3 * nic_s:.1f} ms")


def main() -> int:
    profile = synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                                backward_time_s=0.04, optimizer_time_s=0.002)
    for workers in (2, 3, 4):
        for rate_bps in (1e8, 1e9):
            for spec in ("ps:consistency=ssp:2", "ps:consistency=asp"):
                print(case(profile, spec, workers, rate_bps))
    for rate_bps in (1e8, 1e9):
        for spec in ("ps:consistency=ssp:2", "ps:consistency=asp"):
            print(hierarchical_case(profile, spec, rate_bps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
