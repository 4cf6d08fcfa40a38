"""Chrome/Perfetto JSON from a caramel trace: a process per rank, a thread per lane, flow arrows.

Perfetto requires the slices of one thread to nest exactly: a slice that starts inside another
must also end inside it. Collectives in flight at the same time (chunks of one bucket, or buckets
issued back to back) overlap partially, so each lane is split into as many sub-lanes (threads) as
needed, each properly nested (`assign_sublanes`).

Times are written as integer microseconds relative to the earliest event. Rounding is monotonic,
so nesting and disjointness survive it, and integers avoid the float truncation viewers apply when
converting microseconds to nanoseconds (which can turn an exact nesting into a 1 ns overlap).

Flow arrows run from a bucket's `ready` instant to the `wait` it unblocks: the first wait for
that bucket on the same rank that ends at or after the ready and before the bucket's next ready.
Matching by time rather than by iteration number is deliberate: with `overlap="forward"` the wait
for step k's gradients happens in step k+1's forward and is recorded under iteration k+1.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass

from caramel.jsonio import atomic_write_text
from caramel.trace.events import LANES, Trace, TraceEvent

TID_STRIDE = 1000  # tid = lane_index * TID_STRIDE + sub-lane; sub-lanes beyond this are a programmer error


@dataclass(frozen=True)
class Flow:
    """An arrow from a `ready` instant to the `wait` event it unblocks (indices into trace.events)."""

    ready: int
    wait: int


def to_us(t_s: float, origin_s: float) -> int:
    """Seconds on the trace clock -> integer microseconds since `origin_s` (round half to even, monotonic)."""
    return round((t_s - origin_s) * 1e6)


def assign_sublanes(spans: list[tuple[int, int]]) -> list[int]:
    """A sub-lane per span [start, end] so that no two spans of one sub-lane overlap partially.

    Spans are placed greedily in (start, longest first) order on the first sub-lane where the span
    either nests inside the innermost open span or follows it; zero-length spans always fit the
    first sub-lane. The result has one entry per input span, in input order.
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -(spans[i][1] - spans[i][0]), i))
    stacks: list[list[int]] = []  # per sub-lane: ends of the open spans, innermost last
    lane_of = [0] * len(spans)
    for i in order:
        s, e = spans[i]
        assert e >= s, (s, e)
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lane_of[i] = k
                break
        else:
            stacks.append([e])
            lane_of[i] = len(stacks) - 1
    return lane_of


def find_flows(trace: Trace) -> list[Flow]:
    """Pair each bucket's `ready` instant with the `wait` it unblocks (see the module docstring)."""
    readies: dict[tuple[int, int], list[int]] = defaultdict(list)
    waits: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, e in enumerate(trace.events):
        if e.bucket is None:
            continue
        if e.kind == "ready":
            readies[(e.rank, e.bucket)].append(i)
        elif e.kind == "wait":
            waits[(e.rank, e.bucket)].append(i)
    ev = trace.events
    flows = []
    for key, rs in readies.items():
        rs.sort(key=lambda i: ev[i].start_s)
        ws = sorted(waits.get(key, []), key=lambda i: ev[i].end_s)
        j = 0
        for n, r in enumerate(rs):
            t_ready = ev[r].start_s
            t_next = ev[rs[n + 1]].start_s if n + 1 < len(rs) else float("inf")
            while j < len(ws) and ev[ws[j]].end_s < t_ready:
                j += 1  # a wait that ended before this ready belongs to an earlier step
            if j < len(ws) and ev[ws[j]].end_s < t_next:
                flows.append(Flow(r, ws[j]))
                j += 1
    flows.sort(key=lambda f: (ev[f.ready].start_s, f.ready))
    return flows


def _lane_name(lane: str, sub: int) -> str:
    return lane if sub == 0 else f"{lane} #{sub + 1}"


def _args(e: TraceEvent) -> dict:
    args: dict = {"iteration": e.iteration}
    for key in ("bucket", "chunk", "bytes"):
        value = getattr(e, key)
        if value is not None:
            args[key] = value
    return args


def to_chrome(trace: Trace, flows: bool = True) -> dict:
    """The Chrome trace dict (`traceEvents`, metadata, optional flow arrows) for a caramel trace."""
    ev = trace.events
    origin_s = min((e.start_s for e in ev), default=0.0)
    spans = [(to_us(e.start_s, origin_s), to_us(e.end_s, origin_s)) for e in ev]

    # sub-lanes per (rank, lane); instants are zero-length and always land on sub-lane 0
    tid_of = [0] * len(ev)
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, e in enumerate(ev):
        groups[(e.rank, e.lane)].append(i)
    threads: set[tuple[int, int, str]] = set()
    for (rank, lane), idx in groups.items():
        subs = assign_sublanes([spans[i] for i in idx])
        base = LANES.index(lane) * TID_STRIDE
        for i, sub in zip(idx, subs):
            assert sub < TID_STRIDE, "more overlapping events in one lane than sub-lane ids"
            tid_of[i] = base + sub
            threads.add((rank, base + sub, _lane_name(lane, sub)))

    out: list[dict] = []
    for rank in sorted({e.rank for e in ev}):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for rank, tid, name in sorted(threads):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}})

    # slices, with each flow's start/end right after the slice it binds to: viewers bind a flow
    # event to the innermost slice open on its thread at its timestamp, in file order
    flow_list = find_flows(trace) if flows else []
    starts = {f.ready: n for n, f in enumerate(flow_list)}
    ends = {f.wait: n for n, f in enumerate(flow_list)}
    slices: list[tuple[int, int, list[dict]]] = []
    for i, e in enumerate(ev):
        ts, end = spans[i]
        pid, tid = e.rank, tid_of[i]
        group = [{"ph": "X", "name": e.name, "cat": e.kind, "pid": pid, "tid": tid, "ts": ts, "dur": end - ts, "args": _args(e)}]
        if i in starts:
            group.append({"ph": "s", "name": "ready->wait", "cat": "flow", "id": starts[i], "pid": pid, "tid": tid, "ts": ts})
        if i in ends:
            group.append({"ph": "f", "bp": "e", "name": "ready->wait", "cat": "flow", "id": ends[i], "pid": pid, "tid": tid, "ts": ts})
        slices.append((ts, -(end - ts), group))
    # parents before children at equal start, so a viewer reading in order sees proper nesting
    slices.sort(key=lambda x: (x[0], x[1]))
    for _, _, group in slices:
        out.extend(group)
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "caramel trace merge",
            "source": trace.source,
            "world_size": trace.world_size,
            "origin_s": origin_s,
            "flows": len(flow_list),
        },
    }


def write_chrome(trace: Trace, path: str | os.PathLike, flows: bool = True) -> dict:
    """Write the Chrome/Perfetto JSON for `trace` to `path` (atomically); return what was written."""
    data = to_chrome(trace, flows=flows)
    atomic_write_text(path, json.dumps(data, separators=(",", ":")) + "\n")
    return data
