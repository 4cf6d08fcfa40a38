"""Chrome/Perfetto merge: valid JSON, a process per rank, properly nested lanes, paired flow arrows."""
from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from caramel.trace.chrome import assign_sublanes, find_flows, to_chrome, write_chrome
from caramel.trace.events import Trace, TraceEvent
from caramel.trace.load import load_traces
from tests.trace.tracesynth import split_by_rank, two_rank_trace

pytestmark = pytest.mark.timeout(60)


def _partial(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """True when a and b overlap without one containing the other."""
    (s1, e1), (s2, e2) = sorted([a, b])
    return s1 < s2 < e1 < e2


def _assert_properly_nested(chrome: dict) -> None:
    by_tid = defaultdict(list)
    for e in chrome["traceEvents"]:
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0
            by_tid[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, spans in by_tid.items():
        for i in range(len(spans)):
            for j in range(i + 1, len(spans)):
                assert not _partial(spans[i], spans[j]), (key, spans[i], spans[j])


def test_merge_per_rank_files_is_valid_chrome_json(tmp_path):
    for r, t in enumerate(split_by_rank(two_rank_trace())):
        t.save(tmp_path / f"run.rank{r}.json")
    out = tmp_path / "merged" / "trace.json"
    write_chrome(load_traces([tmp_path]), out)
    data = json.loads(out.read_text())
    evs = data["traceEvents"]
    assert {e["ph"] for e in evs} == {"M", "X", "s", "f"}
    assert {e["pid"] for e in evs} == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    # comm needs a second sub-lane: chunk 1 of bucket 1 overlaps chunk 0 and bucket 0 partially
    assert names == {(r, n) for r in (0, 1) for n in ("compute", "comm", "comm #2", "wait")}
    xs = [e for e in evs if e["ph"] == "X"]
    assert min(e["ts"] for e in xs) == 0  # relative to the earliest event
    src = two_rank_trace()
    assert len(xs) == len(src.events)
    # times are microseconds: the first forward lasts 3 ms
    fwd0 = [e for e in xs if e["pid"] == 0 and e["name"] == "forward" and e["args"]["iteration"] == 0]
    assert fwd0[0]["dur"] == 3000
    _assert_properly_nested(data)


def test_directory_and_multi_rank_file_give_the_same_merge(tmp_path):
    whole = two_rank_trace()
    whole.save(tmp_path / "all.json")
    d = tmp_path / "ranks"
    for r, t in enumerate(split_by_rank(whole)):
        t.save(d / f"run.rank{r}.json")  # the writer creates the directory
    a = to_chrome(load_traces([tmp_path / "all.json"]))
    b = to_chrome(load_traces([d / "run.rank0.json", d / "run.rank1.json"]))
    key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
    assert sorted(map(key, a["traceEvents"])) == sorted(map(key, b["traceEvents"]))


def test_flow_arrows_pair_ready_with_the_wait_it_unblocks():
    trace = two_rank_trace()
    flows = find_flows(trace)
    # 2 ranks x 2 buckets x 4 steps: the last step's waits are the final synchronize()
    assert len(flows) == 16
    for f in flows:
        r, w = trace.events[f.ready], trace.events[f.wait]
        assert (r.kind, w.kind) == ("ready", "wait")
        assert (r.rank, r.bucket) == (w.rank, w.bucket)
        assert w.iteration == r.iteration + 1  # overlap="forward": waited for in the next forward
        assert w.end_s >= r.start_s
    assert len({f.wait for f in flows}) == len(flows)

    chrome = to_chrome(trace)
    starts = {e["id"]: e for e in chrome["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in chrome["traceEvents"] if e["ph"] == "f"}
    assert set(starts) == set(ends) and len(starts) == 16
    slices = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    for fid, s in starts.items():
        f = ends[fid]
        assert s["pid"] == f["pid"] and f["ts"] >= s["ts"] and f["bp"] == "e"
        # each end sits on a wait slice of the same bucket starting at that time, each start on a ready instant
        assert any(x["cat"] == "wait" and x["tid"] == f["tid"] and x["ts"] == f["ts"] and x["pid"] == f["pid"] for x in slices)
        assert any(x["cat"] == "ready" and x["tid"] == s["tid"] and x["ts"] == s["ts"] and x["pid"] == s["pid"] for x in slices)


def test_a_wait_without_its_ready_gets_no_arrow_and_no_cross_step_pairing():
    ev = [
        TraceEvent(0, "comm", "ready", "ready:b0", 1.0, 0.0, 0, bucket=0),
        # no wait for the first ready: its step's wait is missing; the next wait ends after the next ready
        TraceEvent(0, "comm", "ready", "ready:b0", 2.0, 0.0, 1, bucket=0),
        TraceEvent(0, "wait", "wait", "wait:b0", 2.5, 0.1, 2, bucket=0),
    ]
    flows = find_flows(Trace("measured", 1, ev))
    assert [(f.ready, f.wait) for f in flows] == [(1, 2)]


def test_sublanes_never_overlap_partially_on_random_intervals():
    rng = random.Random(7)
    for _ in range(200):
        spans = []
        for _ in range(rng.randint(1, 30)):
            s = rng.randint(0, 100)
            spans.append((s, s + rng.choice([0, rng.randint(1, 40)])))
        lanes = assign_sublanes(spans)
        assert len(lanes) == len(spans)
        for i in range(len(spans)):
            for j in range(i + 1, len(spans)):
                if lanes[i] == lanes[j]:
                    assert not _partial(spans[i], spans[j]), (spans[i], spans[j])
        if not any(_partial(a, b) for a in spans for b in spans):
            assert set(lanes) == {0}  # no split needed, none made


def test_rounding_to_microseconds_keeps_nesting_at_wall_clock_magnitudes():
    # wall-clock seconds near 1.7e9 resolve ~0.24 us; nested events must stay nested after conversion
    base = 1.7e9 + 0.123456789
    trace = two_rank_trace(base_s=base)
    _assert_properly_nested(to_chrome(trace))
