"""`one_at_a_time` on hand-made wire logs: it fails when one group's sends, or one thread's,
overlap in time."""
from __future__ import annotations

from tests.strategies.ps.wire_log import one_at_a_time


def _log(*events):
    """Wire log entries: (event, thread, time, group, send)."""
    return [tuple(e) for e in events]


def test_sends_one_after_another_pass_and_two_groups_may_overlap():
    assert one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("done", 1, 1.0, 7, 0),
                              ("issue", 1, 1.0, 7, 1), ("done", 1, 2.0, 7, 1)))
    assert one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("issue", 2, 0.5, 8, 1),  # another group's sender
                              ("done", 1, 1.0, 7, 0), ("done", 2, 1.5, 8, 1)))
    assert one_at_a_time([])


def test_concurrent_sends_of_one_group_or_one_thread_fail():
    # one thread issues the next async send before waiting for the previous one
    assert not one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("issue", 1, 0.1, 7, 1),
                                  ("done", 1, 1.0, 7, 0), ("done", 1, 1.1, 7, 1)))
    # two threads each one at a time, on the same group, overlapping
    assert not one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("issue", 2, 0.5, 7, 1),
                                  ("done", 1, 1.0, 7, 0), ("done", 2, 1.5, 7, 1)))
    # one thread with two sends in flight at once on two groups: two pulls on its one link
    assert not one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("issue", 1, 0.1, 8, 1),
                                  ("done", 1, 1.0, 7, 0), ("done", 1, 1.1, 8, 1)))
    # a send never waited for, or a completion without its issue
    assert not one_at_a_time(_log(("issue", 1, 0.0, 7, 0)))
    assert not one_at_a_time(_log(("done", 1, 0.0, 7, 0)))
    # a send waited for twice, or completed on another group than it was issued on
    assert not one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("done", 1, 1.0, 7, 0), ("done", 1, 1.1, 7, 0)))
    assert not one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("done", 1, 1.0, 8, 0)))


def test_a_send_waited_for_on_another_thread_pairs_by_its_id():
    # the done is logged by the waiting thread; the span belongs to the issuing one
    assert one_at_a_time(_log(("issue", 1, 0.0, 7, 0), ("done", 3, 1.0, 7, 0),
                              ("issue", 1, 1.0, 8, 1), ("done", 3, 2.0, 8, 1)))
