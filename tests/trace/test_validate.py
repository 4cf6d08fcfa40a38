"""check_trace: every bucket once per step on every rank, ready <= issue <= done <= wait end."""
from __future__ import annotations

import copy

import pytest

from caramel.errors import MismatchError
from caramel.trace.events import Trace
from caramel.trace.validate import check_trace, inspect_trace
from tests.trace.tracesynth import synthetic_plan, two_rank_trace

pytestmark = pytest.mark.timeout(60)


def test_consistent_trace_passes_with_counts():
    result = check_trace(two_rank_trace(), synthetic_plan())
    assert result.ok
    assert result.steps_checked == 8  # 2 ranks x 4 steps
    assert result.buckets_checked == 16


def test_consistent_at_wall_clock_magnitudes():
    # ready and issue read the same clock; anchoring to ~1.7e9 s must not flip their order
    assert check_trace(two_rank_trace(base_s=1.7e9 + 0.3), synthetic_plan()).ok


def _without(trace: Trace, pred) -> Trace:
    return Trace(trace.source, trace.world_size, [e for e in trace.events if not pred(e)])


def test_missing_collective_is_reported():
    t = two_rank_trace()
    bad = _without(t, lambda e: e.rank == 1 and e.kind == "comm" and e.bucket == 1 and e.chunk == 1 and e.iteration == 2)
    with pytest.raises(MismatchError, match="bucket 1 has 7 collectives for 4 steps"):
        check_trace(bad, synthetic_plan())


def test_duplicate_ready_in_a_step_is_reported():
    t = two_rank_trace()
    extra = copy.deepcopy(next(e for e in t.events if e.rank == 0 and e.kind == "ready" and e.bucket == 0 and e.iteration == 1))
    extra.start_s += 0.0001
    bad = Trace(t.source, 2, t.events + [extra])
    problems = inspect_trace(bad, synthetic_plan()).problems
    assert any("rank 0 step 1: bucket 0 has 2 ready events, expected 1" in p for p in problems)


def test_issue_before_ready_is_reported():
    t = copy.deepcopy(two_rank_trace())
    for e in t.events:
        if e.rank == 0 and e.kind == "issue" and e.bucket == 0 and e.iteration == 2:
            e.start_s -= 0.002
    problems = inspect_trace(t, synthetic_plan()).problems
    assert len(problems) == 1 and "rank 0 step 2 bucket 0 chunk 0: issued at" in problems[0]


def test_wait_ending_before_collective_done_is_reported():
    t = copy.deepcopy(two_rank_trace())
    for e in t.events:
        if e.rank == 1 and e.kind == "wait" and e.bucket == 0 and e.iteration == 3:
            e.duration_s = 0.0003  # ends at 0.3 ms, the collective completes at 0.8 ms
    problems = inspect_trace(t, synthetic_plan()).problems
    assert len(problems) == 1 and "rank 1 step 2 bucket 0: wait ended at" in problems[0]


def test_missing_wait_is_reported_unless_allowed():
    t = _without(two_rank_trace(), lambda e: e.rank == 0 and e.kind == "wait" and e.bucket == 1 and e.iteration == 2)
    with pytest.raises(MismatchError, match="rank 0 step 1 bucket 1: no wait event consumes it"):
        check_trace(t, synthetic_plan())
    assert check_trace(t, synthetic_plan(), require_waits=False).ok


def test_wrong_bytes_and_unknown_bucket_are_reported():
    t = copy.deepcopy(two_rank_trace())
    for e in t.events:
        if e.kind == "comm" and e.rank == 0 and e.bucket == 1 and e.chunk == 0 and e.iteration == 0:
            e.bytes = 3996
        if e.kind == "comm" and e.rank == 1 and e.bucket == 0 and e.iteration == 1:
            e.bytes = 4012  # extra bytes (flags riding along) are fine and counted
    result = inspect_trace(t, synthetic_plan())
    assert result.problems == ["rank 0 step 0 bucket 1 chunk 0: 3996 bytes, fewer than the plan's 4000"]
    assert result.extra_bytes == 12
    t2 = copy.deepcopy(two_rank_trace())
    t2.events[0].bucket = 7
    t2.events[0].kind = "ready"
    assert any("names bucket 7, but the plan has 2 buckets" in p for p in inspect_trace(t2, synthetic_plan()).problems)


def test_first_step_checks_only_the_later_stretch():
    t = copy.deepcopy(two_rank_trace())
    for e in t.events:  # corrupt step 0 only: a later plan check from step 1 must not see it
        if e.kind == "issue" and e.iteration == 0:
            e.start_s -= 0.01
    assert not inspect_trace(t, synthetic_plan()).ok
    result = check_trace(t, synthetic_plan(), first_step=1)
    assert result.steps_checked == 6 and result.buckets_checked == 12
