"""Summary arithmetic against numbers worked out by hand from tracesynth's docstring, and metrics formulas."""
from __future__ import annotations

import json
import math

import pytest

from caramel.errors import CaramelError, FormatError
from caramel.stats import percentile
from caramel.trace import metrics as m
from caramel.trace.events import Trace
from caramel.trace.summary import compare, format_summary, summarize
from tests.trace.tracesynth import two_rank_trace

pytestmark = pytest.mark.timeout(60)
MS = 1e-3


def test_per_rank_step_arithmetic_by_hand():
    # step lengths 10, 12, 10, 11 ms; steps 0..2 are complete (step 3 has no next forward)
    s = summarize(two_rank_trace(), warmup_steps=0)
    assert [st.step for st in s.steps] == [0, 1, 2]
    rows = {(r.rank, r.step): r for r in s.rank_steps}
    # rank 0, step 1 (12 ms): compute = forward+backward [0, 7] = 7; comm = previous b0 spill [0, 0.8]
    # plus [4, 12) (b1c0 [4,6] u b1c1 [4.2,7.5] u b0 [6.5, 12)) = 8.8; hidden = 0.8 + [4, 7] = 3.8
    r01 = rows[(0, 1)]
    assert r01.step_time_s == pytest.approx(12 * MS)
    assert r01.compute_s == pytest.approx(7 * MS)
    assert r01.comm_s == pytest.approx(8.8 * MS)
    assert r01.hidden_comm_s == pytest.approx(3.8 * MS)
    assert r01.exposed_comm_s == pytest.approx(5.0 * MS)
    assert r01.wait_s == pytest.approx(0.8 * MS)
    assert r01.bytes == 12000
    # rank 1, step 1: compute [0, 7.5]; comm 0.8 + [4.5, 12) = 8.3; hidden 0.8 + [4.5, 7.5] = 3.8
    r11 = rows[(1, 1)]
    assert r11.compute_s == pytest.approx(7.5 * MS)
    assert r11.comm_s == pytest.approx(8.3 * MS)
    assert r11.hidden_comm_s == pytest.approx(3.8 * MS)
    # step 0 has no spill from an earlier step and no waits
    r00 = rows[(0, 0)]
    assert r00.comm_s == pytest.approx(6.0 * MS)
    assert r00.hidden_comm_s == pytest.approx(3.0 * MS)
    assert r00.wait_s == 0.0


def test_aggregate_after_warmup_by_hand():
    s = summarize(two_rank_trace(), warmup_steps=1)
    a = s.aggregate
    assert a["steps"] == 2 and s.skipped_steps == [0]
    # step times 12 and 10 ms: p50 = 11, p90 = 10 + 0.9 * 2 = 11.8 (linear interpolation)
    assert a["step_time_p50_s"] == pytest.approx(11 * MS)
    assert a["step_time_p90_s"] == pytest.approx(11.8 * MS)
    # per-step means over ranks: compute (7 + 7.5)/2; comm step1 (8.8+8.3)/2 = 8.55, step2 (6.8+6.3)/2 = 6.55
    assert a["compute_s"] == pytest.approx(7.25 * MS)
    assert a["comm_s"] == pytest.approx(7.55 * MS)
    assert a["hidden_comm_s"] == pytest.approx(3.8 * MS)
    assert a["exposed_comm_s"] == pytest.approx(3.75 * MS)
    assert a["wait_s"] == pytest.approx(0.8 * MS)
    assert a["overlap_percent"] == pytest.approx(100 * 3.8 / 7.55)
    assert a["bytes_per_step"] == pytest.approx(12000)
    # 4 rank-steps x 12000 B over 8.8 + 8.3 + 6.8 + 6.3 = 30.2 ms of communication; n = 2: busbw = algbw
    assert a["algbw_bytes_per_s"] == pytest.approx(48000 / (30.2 * MS))
    assert a["busbw_bytes_per_s"] == pytest.approx(a["algbw_bytes_per_s"])
    assert a["straggler_gap_s"] == pytest.approx(0.5 * MS)
    assert (a["slowest_rank"], a["fastest_rank"]) == (1, 0)
    ranks = {r["rank"]: r for r in s.ranks}
    assert ranks[0]["overlap_percent"] == pytest.approx(100 * 7.6 / (8.8 + 6.8))


def test_summary_json_and_text(tmp_path):
    s = summarize(two_rank_trace(), warmup_steps=1)
    s.save(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["format"] == "caramel.trace_summary/1"
    assert data["aggregate"]["steps"] == 2 and len(data["steps"]) == 2 and len(data["rank_steps"]) == 4
    text = format_summary(s)
    assert "p50 11.00 ms" in text and "p90 11.80 ms" in text and "overlap 50.3%" in text


def test_no_communication_gives_null_overlap_not_a_crash(tmp_path):
    t = two_rank_trace()
    t = Trace(t.source, t.world_size, [e for e in t.events if e.lane == "compute"])
    s = summarize(t)
    assert math.isnan(s.aggregate["overlap_percent"])
    s.save(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text())["aggregate"]["overlap_percent"] is None


def test_too_few_steps_and_no_forward_are_clear_errors():
    with pytest.raises(FormatError, match="complete step"):
        summarize(two_rank_trace(), warmup_steps=3)
    t = two_rank_trace()
    with pytest.raises(FormatError, match="no 'forward' events"):
        summarize(Trace(t.source, 2, [e for e in t.events if e.kind != "forward"]))
    with pytest.raises(CaramelError, match="warmup"):
        summarize(t, warmup_steps=-1)


def test_compare_reports_simulator_error():
    meas = summarize(two_rank_trace((10.0, 10.0, 10.0)))
    pred = summarize(two_rank_trace((11.0, 11.0, 11.0)))
    cmp = compare(meas, pred)
    assert cmp["step_time_error"] == pytest.approx(0.1)


def test_metric_formulas():
    assert m.union_intervals([(0, 1), (1, 2), (5, 6), (5.5, 5.7), (3, 3)]) == [(0, 2), (5, 6)]
    assert m.intersect_length([(0, 4)], [(1, 2), (3, 6)]) == pytest.approx(2)
    assert m.clip([(0, 10)], 2, 5) == [(2, 5)]
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5], 90) == 5 and math.isnan(percentile([], 50))
    assert m.no_overlap_bound_s(3, 2) == 5 and m.perfect_overlap_bound_s(3, 2) == 3
    # U = 5, L = 3: T_iter 4 is halfway
    assert m.scheduling_efficiency(4, 3, 2) == pytest.approx(0.5)
    assert m.scheduling_efficiency(5, 3, 2) == 0 and m.scheduling_efficiency(3, 3, 2) == 1
    assert math.isnan(m.scheduling_efficiency(3, 3, 0))
    assert m.exposed_comm_s(4, 3) == 1 and m.exposed_comm_s(2, 3) == 0
    assert m.overlap_percent(1, 4) == 25
    assert m.busbw_bytes_per_s(100.0, 4) == pytest.approx(150.0)
    assert m.busbw_bytes_per_s(100.0, 1) == 0
    # 4 workers, 1 MB at 1e6 B/s, 1 ms latency: 6 * 1e-3 + 1.5 * 1 s
    assert m.ring_allreduce_time_s(4, 1e6, 1e-3, 1e6) == pytest.approx(1.506)
    assert m.ring_allreduce_time_s(1, 1e6, 1e-3, 1e6) == 0
    assert m.relative_error(11, 10) == pytest.approx(0.1)
