"""A local search over the layouts `replicas="auto"` can run, by the step they are scored at.

The dynamic program (`auto_replicas._Program`) minimizes the slowest per-stage sum at one set of
speeds. On a host whose ranks share its cores, what a layout's step comes to depends on the
layout itself: a less balanced cut keeps fewer ranks computing at once, and each runs nearer
its alone pace (`sharing.py`), so the fastest layout under the settled model can be one no
program over per-stage sums proposes, at any one speed. `descend` starts from each stage and
microbatch count's fastest proposal and takes the best of its `neighbours` (one cut moved
anywhere between its neighbours together with the replicas of the two stages it parts) while the score drops, within a budget of replayed work (stages x
microbatches summed over the layouts scored, `SEARCH_BUDGET`). A local
search, not an exact one: on 200 random shared-host cases of 3-6 layers it misses the fastest
layout of all (brute force) in 3, by up to 1.5% (`experiments/pipeline_proposer_search.py`,
docs/pipeline.md). The proposals miss on unshared hosts too, where `choose_replicas` leaves
them unsearched (its picks there bit for bit as before; the same experiment, `--unshared`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.options import MAX_VIRTUAL_PIPELINES

# what the search may spend beyond the proposals, in stages x microbatches summed over the
# layouts it scores: a layout's settled step is a few replays of about 2 x stages x microbatches
# actions each, so this bounds the replayed actions, where a count of layouts did not (a
# 16-stage, 32-microbatch layout replays 64 times a 2-stage, 4-microbatch one's actions).
# Several times what the random 4-worker cases of experiments/pipeline_proposer_search.py
# spend, so their picks are those of a count of 400 layouts; deterministic, as a wall-clock
# limit would not be (the runtime's pick must equal the prediction's). Measured, in seconds
# too: docs/results/pipeline_chooser_cost.md
SEARCH_BUDGET = 8192


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


def search_cost(lay: Layout) -> int:
    """What scoring `lay` takes of the search's budget: its stages x microbatches."""
    return len(lay.counts) * lay.microbatches


def neighbours(lay: Layout, layers: int, schedule: str, equal_counts: bool) -> list[Layout]:
    """The layouts one move from `lay` that the runtime can run: one cut moved anywhere between
    its neighbours together with (unequal counts allowed) the replicas of the two stages it
    parts split anew. The microbatch count stays: each count's fastest proposal is a start of
    its own (a move to another count changed no pick in 200 random cases, nor the 24-layer
    chain's; docs/pipeline.md)."""
    cuts, counts, m = lay.cuts, lay.counts, lay.microbatches
    out: list[Layout] = []
    for i in range(len(cuts)):
        low, high = cuts[i - 1] if i else 0, cuts[i + 1] if i + 1 < len(cuts) else layers
        pair = counts[i] + counts[i + 1]
        splits = [counts[i]] if equal_counts else range(1, pair)
        for at, left in itertools.product(range(low + 1, high), splits):
            moved = Layout(cuts[:i] + (at,) + cuts[i + 1:], counts[:i] + (left, pair - left) + counts[i + 2:], m)
            if moved != lay and feasible(moved.counts, m, schedule):
                out.append(moved)
    return out


def descend(layouts: dict[Layout, SimResult], layers: int, schedule: str, equal_counts: bool,
            score: Callable[[Layout], SimResult], budget: int = SEARCH_BUDGET) -> tuple[int, int]:
    """From each stage and microbatch count's fastest layout in `layouts` (the fastest first),
    steepest descent over `neighbours` by `score` (the settled step: `sharing.settle`); every
    layout scored is added to `layouts`. A descent ends when no neighbour is faster; the search
    at the first layout whose `search_cost` exceeds what is left of `budget` (it may stop inside
    a descent). Returns what it spent: the layouts it scored and their stages x microbatches."""
    scored = spent = 0
    starts: dict[tuple[int, int], Layout] = {}
    for lay, sim in layouts.items():
        key = (len(lay.counts), lay.microbatches)
        if key not in starts or sim.step_time_s < layouts[starts[key]].step_time_s:
            starts[key] = lay
    for here in sorted(starts.values(), key=lambda lay: layouts[lay].step_time_s):
        while True:
            near = neighbours(here, layers, schedule, equal_counts)
            for lay in near:
                if lay not in layouts:
                    if search_cost(lay) > budget - spent:
                        return scored, spent
                    layouts[lay] = score(lay)
                    scored, spent = scored + 1, spent + search_cost(lay)
            best = min(near + [here], key=lambda lay: layouts[lay].step_time_s)
            if layouts[best].step_time_s >= layouts[here].step_time_s:
                break
            here = best
    return scored, spent
