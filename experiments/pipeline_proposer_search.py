"""`replicas="auto"` on a shared host against every layout: random small cases, brute force.

Each case is a random chain of layers (compute shares, parameter bytes), four workers on one
host that compute `alone_speedup` times faster alone, a random link, transfer CPU share and
schedule. Every layout the runtime can run (stage count, cut, replicas per stage, microbatch
count) is scored as the chooser scores its candidates (`auto_replicas._score` at the speeds its
own host load settles at, `sharing.settle`); the chooser's pick is compared with the fastest of
them, with the local search over cuts (`auto_replicas.descend`) and without it (the
proposers before: the dynamic program and the compute-balanced cut only).

`--unshared`: the same cases with `alone_speedup=1` (no host sharing), where `replicas="auto"`
scores the proposals only and the search runs only as forced here (`search=True`).

    PYTHONPATH=. python experiments/pipeline_proposer_search.py --cases 200 --seed 0
    PYTHONPATH=. python experiments/pipeline_proposer_search.py --cases 80 --seed 0 --unshared
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import time

import caramel.strategies.pipeline.auto_replicas as auto_replicas
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.auto_replicas import MAX_MICROBATCHES, choose_replicas
from caramel.strategies.pipeline.layout_search import SEARCH_BUDGET, Layout, feasible
from caramel.strategies.pipeline.profile_costs import scaling_from_profile
from caramel.strategies.pipeline.sharing import settle
from caramel.strategies.pipeline.transport import posting_for
from caramel.topology.spec import ClusterSpec


@dataclasses.dataclass(frozen=True)
class Case:
    """One random input: the profile's layers, the cluster, the batch, the schedule, the stages asked."""

    sizes: tuple[int, ...]
    times: tuple[float, ...]
    cluster: ClusterSpec
    batch: int
    schedule: str
    stages: int | None

    def layers(self):
        prof = dataclasses.replace(synthetic_profile(sizes_bytes=list(self.sizes), times_s=list(self.times)),
                                   batch_size=1)
        return scaling_from_profile(prof)[1], prof.optimizer_time_s


def random_case(rng: random.Random, workers: int = 4) -> Case:
    n = rng.randint(3, 6)
    base = ClusterSpec.uniform(workers, rng.choice([2e8, 5e8, 1e9, 4e9]),
                               compute_slowdown=rng.uniform(1.0, 2.0), collective_cpu_s=rng.uniform(0, 3e-3))
    cluster = dataclasses.replace(base, ranks_per_host=workers, alone_speedup=rng.uniform(1.2, 2.5))
    return Case(tuple(rng.choice([4096, 40_000, 400_000, 4_000_000]) for _ in range(n)),
                tuple(rng.uniform(0.1, 1.0) for _ in range(n)), cluster, rng.choice([4, 8, 12, 16]),
                rng.choice(["gpipe", "1f1b"]), rng.choice([None, 2]))


def every_layout(case: Case) -> dict[Layout, float]:
    """Every runnable layout's settled step, scored as `choose_replicas` scores a candidate."""
    layers, optimizer_s = case.layers()
    n, w = len(layers), case.cluster.world_size
    posting = posting_for("rendezvous", case.schedule, "replicas=auto")
    out: dict[Layout, float] = {}
    stage_counts = [case.stages] if case.stages else range(2, min(n, w) + 1)
    for m in [m for m in range(1, min(case.batch, MAX_MICROBATCHES) + 1) if case.batch % m == 0]:
        costs = [layer.at(case.batch / m) for layer in layers]
        for s in stage_counts:
            for cuts in itertools.combinations(range(1, n), s - 1):
                for counts in itertools.product(range(1, w + 1), repeat=s):
                    if sum(counts) != w or not feasible(counts, m, case.schedule):
                        continue
                    lay = Layout(cuts, counts, m)
                    out[lay] = settle(lambda f, lay=lay: auto_replicas._score(
                        lay, costs, case.cluster, f, case.schedule, optimizer_s, [], "caramel", None, posting),
                        case.cluster).step_time_s
    return out


def pick(case: Case, search: bool) -> tuple[float, int]:
    """The chooser's predicted step and what its search spent (stages x microbatches)."""
    layers, optimizer_s = case.layers()
    ch = choose_replicas(layers, case.batch, case.schedule, case.cluster, case.stages,
                         optimizer_s=optimizer_s, search=search)
    return ch.predicted_step_s, ch.search_spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unshared", action="store_true", help="the same cases with alone_speedup=1 (no sharing)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    most_spent = 0
    gaps = {"before": [], "search": []}
    seconds = {"before": 0.0, "search": 0.0}
    for i in range(args.cases):
        case = random_case(rng)
        if args.unshared:
            case = dataclasses.replace(case, cluster=dataclasses.replace(case.cluster, alone_speedup=1.0))
        best = min(every_layout(case).values())
        t = time.perf_counter()
        before, _ = pick(case, search=False)
        seconds["before"] += time.perf_counter() - t
        t = time.perf_counter()
        search, spent = pick(case, search=True)
        seconds["search"] += time.perf_counter() - t
        most_spent = max(most_spent, spent)
        for key, got in (("before", before), ("search", search)):
            gaps[key].append(got / best - 1)
        if search > best * (1 + 1e-9) or before > best * (1 + 1e-9):
            print(f"case {i}: best {best * 1e3:.2f} ms, before {before / best - 1:+.2%}, "
                  f"search {search / best - 1:+.2%}")
    for key, g in gaps.items():
        missed = [x for x in g if x > 1e-9]
        print(f"{key}: {len(missed)} of {len(g)} cases miss the fastest layout; worst {max(g):+.2%}; "
              f"mean gap {sum(g) / len(g):+.3%}; chooser time {seconds[key]:.1f} s in all")
    print(f"the search spent at most {most_spent} of its budget of {SEARCH_BUDGET} stages x microbatches in one case")


if __name__ == "__main__":
    main()
