"""One event schema for measured and predicted timelines.

An event is an interval (`duration_s > 0`) or an instant (`duration_s == 0`) on one rank's
lane. Lanes: `compute` (forward/backward per module, optimizer), `comm` (collectives),
`wait` (time a rank is blocked on communication). `kind` says what it is; `bucket`, `chunk`
and `bytes` tie communication events to the plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.errors import FormatError
from caramel.jsonio import check_format, format_tag, from_fields, read_json, require, require_mapping, write_json

KIND = "trace"
LANES = ("compute", "comm", "wait")
EVENT_KINDS = ("forward", "backward", "deferred", "optimizer", "ready", "issue", "comm", "wait", "apply", "step", "sync")


@dataclass
class TraceEvent:
    rank: int
    lane: str
    kind: str
    name: str
    start_s: float
    duration_s: float
    iteration: int
    bucket: int | None = None
    chunk: int | None = None
    bytes: int | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass
class Trace:
    """Events from all ranks of one run (measured) or one simulation (predicted)."""

    source: str  # "measured" or "predicted"
    world_size: int
    events: list[TraceEvent]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": format_tag(KIND),
            "source": self.source,
            "world_size": self.world_size,
            "meta": self.meta,
            "events": [asdict(e) for e in self.events],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<trace>") -> "Trace":
        check_format(data, KIND, source)
        raw = require(data, "events", list, source)
        events = []
        for i, e in enumerate(raw):
            ev = from_fields(TraceEvent, e, f"{source}: events[{i}]")
            if ev.lane not in LANES:
                raise FormatError(f"{source}: events[{i}].lane is {ev.lane!r}; expected one of {', '.join(LANES)}")
            if not isinstance(ev.duration_s, (int, float)) or ev.duration_s < 0:
                raise FormatError(f"{source}: events[{i}].duration_s must be >= 0, got {ev.duration_s!r}")
            events.append(ev)
        return cls(
            source=require(data, "source", str, source),
            world_size=require(data, "world_size", int, source),
            events=events,
            meta=require_mapping(data, "meta", source),
        )

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "Trace":
        return cls.from_dict(read_json(path, KIND), str(path))
