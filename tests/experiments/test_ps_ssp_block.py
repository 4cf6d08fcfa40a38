"""experiments/ps_ssp_block.py: the simulator's step times over the bench's block, and the
transfers the runtime's rules force inside one block."""
from types import SimpleNamespace

from caramel.trace.events import TraceEvent


def _result(ends_by_rank):
    events = [TraceEvent(w, "compute", "step", "step", a, b - a, k)
              for w, ends in enumerate(ends_by_rank) for k, (a, b) in enumerate(zip([0.0] + ends[:-1], ends))]
    return SimpleNamespace(trace=SimpleNamespace(events=events))


def test_the_block_is_timed_from_each_ranks_entry_step_by_the_slowest_clock():
    from experiments.ps_ssp_block import block_times_s

    # entry steps end at 1.0 and 2.0; then rank 0 takes 1, 1, 4 and rank 1 takes 2, 2, 1 (a later
    # step 4 lies beyond the block and is left out)
    res = _result([[1.0, 2.0, 3.0, 7.0, 8.0], [2.0, 4.0, 6.0, 7.0, 9.0]])
    # clocks 1|2, 2|4, 6|5: the slowest rank's advance per index
    assert block_times_s(res, 2, 3) == [2.0, 2.0, 2.0]


def test_staleness_leaves_its_bound_of_updates_to_the_untimed_drain():
    from experiments.ps_ssp_block import forced_in_block

    assert forced_in_block(8, 0) == (8, 8)  # bsp: a steady block's transfers
    assert forced_in_block(8, 2) == (6, 6)  # ssp:2: 12 of 16
    assert forced_in_block(1, 2) == (0, 0)
