"""What `replicas="auto"`'s search around the proposals costs on a shared host: wall time.

A random synthetic chain of `--layers` layers (compute shares, parameter bytes; seed 1), all
`--workers` ranks on one host that computes twice as fast alone, 1f1b, every stage and
microbatch count free. `choose_replicas` runs twice in one process, back to back: the
proposals only (the dynamic program and the compute-balanced cut, `descend` off), then with the
search (`layout_search.descend`). Printed per run: wall seconds, layouts settled
(`sharing.settle`), the layouts the search scored and their stages x microbatches (what it
spends of `layout_search.SEARCH_BUDGET`), and the pick. Time it on a quiet host (the bench
wrapper), the numbers go in docs/results/pipeline_chooser_cost.md.

    PYTHONPATH=. python experiments/pipeline_chooser_cost.py --layers 64 --workers 16 --batch 64
    PYTHONPATH=. python experiments/pipeline_chooser_cost.py --layers 24 --workers 8 --batch 32 --budget 32768
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time

import caramel.strategies.pipeline.auto_replicas as auto_replicas
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.layout_search import SEARCH_BUDGET
from caramel.strategies.pipeline.profile_costs import scaling_from_profile
from caramel.topology.spec import ClusterSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--budget", type=int, default=SEARCH_BUDGET, help="the search's budget, stages x microbatches")
    args = ap.parse_args()
    rng = random.Random(1)
    prof = dataclasses.replace(synthetic_profile(
        sizes_bytes=[rng.choice([40_000, 400_000, 4_000_000]) for _ in range(args.layers)],
        times_s=[rng.uniform(0.1, 1.0) for _ in range(args.layers)]), batch_size=1)
    layers = scaling_from_profile(prof)[1]
    cluster = dataclasses.replace(ClusterSpec.uniform(args.workers, 1e9, compute_slowdown=1.5, collective_cpu_s=1e-3),
                                  ranks_per_host=args.workers, alone_speedup=2.0)
    print(f"{args.layers} layers, {args.workers} shared ranks, batch {args.batch}, 1f1b; "
          f"budget {args.budget} stages x microbatches")
    for label, search in (("proposals", False), ("search", None)):
        t = time.perf_counter()
        ch = auto_replicas.choose_replicas(layers, args.batch, "1f1b", cluster, optimizer_s=prof.optimizer_time_s,
                                           search=search, search_budget=args.budget)
        print(f"{label}: {time.perf_counter() - t:.1f} s, {ch.settled} layouts settled, the search "
              f"{ch.searched} ({ch.search_spent} stages x microbatches); pick cuts {ch.plan.boundaries} counts "
              f"{ch.counts} microbatches {ch.microbatches}, {ch.predicted_step_s * 1e3:.1f} ms", flush=True)

if __name__ == "__main__":
    main()
