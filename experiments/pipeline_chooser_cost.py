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
from caramel.strategies.pipeline.layout_search import SEARCH_BUDGET, search_cost
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
    settled, searched, spent = [0], [0], [0]
    settle, descend = auto_replicas.settle, auto_replicas.descend

    def counted_settle(*a, **k):
        settled[0] += 1
        return settle(*a, **k)

    def counted_descend(layouts, layers_n, schedule, equal, score, *a, **k):
        def counted_score(lay):
            searched[0], spent[0] = searched[0] + 1, spent[0] + search_cost(lay)
            return score(lay)
        return descend(layouts, layers_n, schedule, equal, counted_score, args.budget)

    auto_replicas.settle = counted_settle
    print(f"{args.layers} layers, {args.workers} shared ranks, batch {args.batch}, 1f1b; "
          f"budget {args.budget} stages x microbatches")
    for label, search in (("proposals", lambda *a, **k: None), ("search", counted_descend)):
        settled[0] = searched[0] = spent[0] = 0
        auto_replicas.descend = search
        t = time.perf_counter()
        ch = auto_replicas.choose_replicas(layers, args.batch, "1f1b", cluster, optimizer_s=prof.optimizer_time_s)
        print(f"{label}: {time.perf_counter() - t:.1f} s, {settled[0]} layouts settled, the search "
              f"{searched[0]} ({spent[0]} stages x microbatches); pick cuts {ch.plan.boundaries} counts "
              f"{ch.counts} microbatches {ch.microbatches}, {ch.predicted_step_s * 1e3:.1f} ms", flush=True)
    auto_replicas.settle, auto_replicas.descend = settle, descend


if __name__ == "__main__":
    main()
