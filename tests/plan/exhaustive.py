"""Every grouping of consecutive parameters, for the planner's exhaustive-search oracles."""
import itertools

from caramel.topology.spec import ClusterSpec
from caramel.plan.planners import ready_sorted
from caramel.sim.synthetic import synthetic_profile

CASES = {  # name: (sizes, compute shares)
    "equal": ([400_000] * 5, None),
    "last-layer-big": ([200_000] * 4 + [2_000_000], None),
    "front-heavy-compute": ([500_000] * 5, [5, 1, 1, 1, 1]),
}
# the planner misses the exact inputs' optimum over every order here (1.3% at 1 Gbit/s with
# forward overlap: the best order is not of its ready/need/hybrid form); the spread's oracle
# searches the planner's own orders, so this case serves the spread's tests only
UNEVEN = ([100_000, 900_000, 300_000, 1_500_000, 50_000], [1, 3, 1, 2, 1])


def case_inputs(case, bandwidth_bps):
    """A case's profile (sizes and compute shares) and the 4-worker, 1 ms cluster the tests plan for."""
    sizes, times = case
    return synthetic_profile(sizes_bytes=sizes, times_s=times), ClusterSpec.uniform(4, bandwidth_bps, 1e-3)


def consecutive_groupings(prof):
    """Each way to cut the ready-ordered parameters into buckets of neighbours (2^(n-1) of them)."""
    ps = ready_sorted(prof)
    for cuts in itertools.product([0, 1], repeat=len(ps) - 1):
        groups, cur = [], [ps[0]]
        for p, cut in zip(ps[1:], cuts):
            if cut:
                groups.append(cur)
                cur = []
            cur.append(p)
        groups.append(cur)
        yield groups
