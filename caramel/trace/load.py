"""Loading traces: per-rank files, a directory of them, or one multi-rank file, checked and combined.

`Trace.from_dict` checks the schema's shape; `check_events` adds what the tools rely on (finite
times, ranks inside the world, integer iterations and bucket ids), so a hand-edited or corrupted
file fails here with one line naming the file and the event instead of deep inside a plot.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

from caramel.errors import FormatError, is_int
from caramel.jsonio import format_tag
from caramel.trace.events import KIND, Trace, TraceEvent


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_events(trace: Trace, source: str = "<trace>") -> Trace:
    """Raise `FormatError` unless every event has finite times, a rank in range and integer ids."""
    if trace.world_size < 1:
        raise FormatError(f"{source}: field 'world_size' must be >= 1, got {trace.world_size}")
    if trace.source not in ("measured", "predicted"):
        raise FormatError(f"{source}: field 'source' must be 'measured' or 'predicted', got {trace.source!r}")
    for i, e in enumerate(trace.events):
        where = f"{source}: events[{i}]"
        if not is_int(e.rank) or not (0 <= e.rank < trace.world_size):
            raise FormatError(f"{where}.rank must be an integer in [0, {trace.world_size}), got {e.rank!r}")
        if not _is_number(e.start_s):
            raise FormatError(f"{where}.start_s must be a finite number of seconds, got {e.start_s!r}")
        if not _is_number(e.duration_s):
            raise FormatError(f"{where}.duration_s must be a finite number of seconds, got {e.duration_s!r}")
        if not is_int(e.iteration) or e.iteration < 0:
            raise FormatError(f"{where}.iteration must be a non-negative integer, got {e.iteration!r}")
        if not isinstance(e.kind, str) or not isinstance(e.name, str):
            raise FormatError(f"{where}: 'kind' and 'name' must be strings")
        for key in ("bucket", "chunk", "bytes"):
            value = getattr(e, key)
            if value is not None and (not is_int(value) or value < 0):
                raise FormatError(f"{where}.{key} must be a non-negative integer or null, got {value!r}")
    return trace


def load_trace(path: str | os.PathLike) -> Trace:
    """One caramel.trace/1 file, fully checked."""
    return check_events(Trace.load(path), str(path))


def _traces_in(directory: Path) -> list[tuple[str, Trace]]:
    """The caramel traces in a directory; Chrome traces (e.g. our own merge output) and caramel
    files of other kinds (the profile and cluster a traced run planned from) are skipped."""
    found = []
    for p in sorted(directory.glob("*.json")):
        data = load_any_json(p)
        if "traceEvents" in data and "format" not in data:
            continue
        fmt = data.get("format")
        if isinstance(fmt, str) and fmt.startswith("caramel.") and not fmt.startswith(f"caramel.{KIND}/"):
            continue
        found.append((str(p), check_events(Trace.from_dict(data, str(p)), str(p))))
    if not found:
        raise FormatError(f"{directory}: no caramel trace files (*.json with \"format\": \"{format_tag(KIND)}\") in this directory")
    return found


def combine(traces: list[tuple[str, Trace]]) -> Trace:
    """One trace from several (per-rank files of one run): same source, no rank twice."""
    assert traces, "combine needs at least one trace"
    if len(traces) == 1:
        return traces[0][1]
    sources = {t.source for _, t in traces}
    if len(sources) > 1:
        names = ", ".join(f"{n} ({t.source})" for n, t in traces)
        raise FormatError(f"cannot merge measured and predicted traces into one timeline: {names}; "
                          "pass the predicted trace separately (e.g. `caramel trace plot --predicted`)")
    owner: dict[int, str] = {}
    events: list[TraceEvent] = []
    for name, t in traces:
        for r in sorted({e.rank for e in t.events}):
            if r in owner:
                raise FormatError(f"rank {r} appears in both {owner[r]} and {name}; pass each rank's trace once")
            owner[r] = name
        events.extend(t.events)
    world = max(t.world_size for _, t in traces)
    # the plan's facts every rank shares (the first rank's), with where the events came from
    shared = {k: v for k, v in min(traces, key=lambda nt: nt[1].meta.get("rank", 0))[1].meta.items() if k != "rank"}
    meta = dict(shared, merged_from=[n for n, _ in traces])
    return Trace(traces[0][1].source, world, events, meta)


def load_traces(paths: Iterable[str | os.PathLike]) -> Trace:
    """Load and combine per-rank trace files, directories of them, or one multi-rank file."""
    loaded: list[tuple[str, Trace]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            loaded.extend(_traces_in(p))
        else:
            loaded.append((str(p), load_trace(p)))
    if not loaded:
        raise FormatError("no trace files given (expected per-rank caramel.trace/1 files or a directory of them)")
    return combine(loaded)


def load_any_json(path: str | os.PathLike) -> dict:
    """A JSON object from `path` with clear errors for missing or truncated files (no format check)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise FormatError(f"{p}: no such file") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise FormatError(f"{p}: not a JSON text file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); the file may be truncated") from None
    if not isinstance(data, dict):
        raise FormatError(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


