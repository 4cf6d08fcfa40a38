"""Every grouping of consecutive parameters, for the planner's exhaustive-search oracles."""
import itertools

from caramel.plan.planners import ready_sorted

CASES = {  # name: (sizes, compute shares)
    "equal": ([400_000] * 5, None),
    "last-layer-big": ([200_000] * 4 + [2_000_000], None),
    "front-heavy-compute": ([500_000] * 5, [5, 1, 1, 1, 1]),
}


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
