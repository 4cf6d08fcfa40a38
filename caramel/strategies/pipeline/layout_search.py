"""A local search over the layouts `replicas="auto"` can run, by the step they are scored at.

The dynamic program (`auto_replicas._Program`) minimizes the slowest per-stage sum at one set of
speeds. On a host whose ranks share its cores, what a layout's step comes to depends on the
layout itself: a less balanced cut keeps fewer ranks computing at once, and each runs nearer
its alone pace (`sharing.py`), so the fastest layout under the settled model can be one no
program over per-stage sums proposes, at any one speed. `descend` starts from each stage and
microbatch count's fastest proposal and takes the best of its `neighbours` (one cut moved
anywhere between its neighbours together with the replicas of the two stages it parts, or
another microbatch count) while the score drops, within a budget of scored layouts. A local
search, not an exact one: on 200 random shared-host cases of 3-6 layers it misses the fastest
layout of all (brute force) in 3, by up to 1.5% (`experiments/pipeline_proposer_search.py`,
docs/pipeline.md).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.options import MAX_VIRTUAL_PIPELINES

# layouts the search scores at most, beyond the proposals: each is a settled replay (a few ms
# to tens of ms), so a model of many layers on many workers stops here rather than in minutes
MAX_SEARCHED = 400

def feasible(counts: tuple[int, ...] | list[int], microbatches: int, schedule: str) -> bool:
    """Whether the runtime runs these counts with M microbatches (`unequal.py`'s round-robin)."""
    period = math.lcm(*counts)
    # equal counts run as a hybrid of r pipelines, no virtual pipelines: no limit on r
    return ((period <= MAX_VIRTUAL_PIPELINES or len(set(counts)) == 1) and microbatches % period == 0
            and (schedule != "1f1b" or microbatches // period >= len(counts)))


@dataclass(frozen=True)
class Layout:
    """A candidate of `auto_replicas.choose_replicas`: the cut, the replicas per stage, the step's microbatches."""

    cuts: tuple[int, ...]
    counts: tuple[int, ...]
    microbatches: int


def neighbours(lay: Layout, layers: int, microbatch_options: list[int], schedule: str,
               equal_counts: bool) -> list[Layout]:
    """The layouts one move from `lay` that the runtime can run: another microbatch count, or
    one cut moved anywhere between its neighbours together with (unequal counts allowed) the
    replicas of the two stages it parts split anew."""
    cuts, counts, m = lay.cuts, lay.counts, lay.microbatches
    out = [Layout(cuts, counts, k) for k in microbatch_options if k != m and feasible(counts, k, schedule)]
    for i in range(len(cuts)):
        low, high = cuts[i - 1] if i else 0, cuts[i + 1] if i + 1 < len(cuts) else layers
        pair = counts[i] + counts[i + 1]
        splits = [counts[i]] if equal_counts else range(1, pair)
        for at, left in itertools.product(range(low + 1, high), splits):
            moved = Layout(cuts[:i] + (at,) + cuts[i + 1:], counts[:i] + (left, pair - left) + counts[i + 2:], m)
            if moved != lay and feasible(moved.counts, m, schedule):
                out.append(moved)
    return out


def descend(layouts: dict[Layout, SimResult], layers: int, microbatch_options: list[int], schedule: str,
            equal_counts: bool, score: Callable[[Layout], SimResult], budget: int = MAX_SEARCHED) -> None:
    """From each stage and microbatch count's fastest layout in `layouts` (the fastest first),
    steepest descent over `neighbours` by `score` (the settled step: `sharing.settle`); every
    layout scored is added to `layouts`. A descent ends when no neighbour is faster; the search
    when `budget` layouts have been scored (it may stop inside a descent)."""
    starts: dict[tuple[int, int], Layout] = {}
    for lay, sim in layouts.items():
        key = (len(lay.counts), lay.microbatches)
        if key not in starts or sim.step_time_s < layouts[starts[key]].step_time_s:
            starts[key] = lay
    for here in sorted(starts.values(), key=lambda lay: layouts[lay].step_time_s):
        while True:
            near = neighbours(here, layers, microbatch_options, schedule, equal_counts)
            for lay in near:
                if lay not in layouts:
                    if budget <= 0:
                        return
                    layouts[lay], budget = score(lay), budget - 1
            best = min(near + [here], key=lambda lay: layouts[lay].step_time_s)
            if layouts[best].step_time_s >= layouts[here].step_time_s:
                break
            here = best
