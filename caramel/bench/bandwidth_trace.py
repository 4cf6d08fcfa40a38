"""`caramel bench --bandwidth-trace FILE`: a link rate that changes during the run, as data.

A trace is a list of phases, each a duration and a rate; the emulated cluster's links run at
phase 0's rate from the start of the measured rounds, then change at each phase boundary (the
launcher's `TraceController` applies them with tc), and the last phase's rate holds until the
rounds end. A rate is absolute in tc syntax (`1gbit`, `100mbit`) or relative to the
configuration's own rate, `x1` / `x0.1`: the one `--ratio` derives at run start (or
`--bandwidth` pins), so a trace means the same comm/compute regimes on a faster or slower host.

JSON, a list of phases or `{"phases": [...]}`:

    [{"duration_s": 30, "rate": "x1"}, {"duration_s": 30, "rate": "x0.1"}]

CSV, one phase a line, `duration_s,rate`, an optional header line and `#` comments:

    duration_s,rate
    30,1gbit
    30,100mbit
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caramel.errors import CaramelError
from caramel.units import format_rate, parse_rate_bps

MIN_RATE_BPS = 8e3  # tc's floor (`caramel.cluster.config.check_rate`)
EXAMPLE = '[{"duration_s": 30, "rate": "x1"}, {"duration_s": 30, "rate": "x0.1"}]'


@dataclass(frozen=True)
class Phase:
    """One phase as written: `rate_bps` when absolute, else `factor` times the base rate."""

    duration_s: float
    rate_bps: float | None = None
    factor: float | None = None

    @property
    def text(self) -> str:
        return f"x{self.factor:g}" if self.factor is not None else format_rate(self.rate_bps)


@dataclass(frozen=True)
class BandwidthTrace:
    """A parsed, checked trace (`source` names the file in errors and reports)."""

    phases: tuple[Phase, ...]
    source: str = "<trace>"

    @property
    def total_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    @property
    def relative(self) -> bool:
        return any(p.factor is not None for p in self.phases)

    def resolve(self, base_bps: float | None) -> list[dict[str, Any]]:
        """Every phase with its rate in bits per second (`x` rates times `base_bps`), in the
        JSON form the job and the controller take: start_s (from the trace's start), duration_s,
        rate_bps, rate (as written)."""
        if self.relative and base_bps is None:
            first = next(i for i, p in enumerate(self.phases) if p.factor is not None)
            raise CaramelError(f"bandwidth trace {self.source}, phase {first + 1}: rate "
                               f"{self.phases[first].text} is relative; give --ratio or --bandwidth for the rate x1 "
                               "stands for, or write absolute rates (e.g. 100mbit)")
        out, start = [], 0.0
        for i, p in enumerate(self.phases):
            bps = p.rate_bps if p.factor is None else p.factor * base_bps
            if bps < MIN_RATE_BPS:
                raise CaramelError(f"bandwidth trace {self.source}, phase {i + 1}: {p.text} is {bps:g} bit/s, below "
                                   f"tc's floor of {MIN_RATE_BPS:g} bit/s")
            out.append({"start_s": start, "duration_s": p.duration_s, "rate_bps": bps, "rate": p.text})
            start += p.duration_s
        return out


def _error(source: str, where: str, msg: str) -> CaramelError:
    return CaramelError(f"bandwidth trace {source}{', ' + where if where else ''}: {msg}")


def parse_phase(duration: Any, rate: Any, source: str, index: int) -> Phase:
    """One phase from its two fields, or one clear error naming the file, the phase and the field."""
    where = f"phase {index + 1}"
    try:
        d = float(duration)
    except (TypeError, ValueError):
        d = math.nan
    if isinstance(duration, bool) or not (math.isfinite(d) and d > 0):
        raise _error(source, where, f"duration_s {duration!r}: expected a positive number of seconds, e.g. 30")
    if not isinstance(rate, str) or not rate.strip():
        raise _error(source, where, f"rate {rate!r}: expected a tc rate (e.g. 100mbit) or a factor of the "
                                    "configuration's rate (e.g. x0.1)")
    text = rate.strip()
    if text[:1] in ("x", "X"):
        try:
            f = float(text[1:])
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and f > 0):
            raise _error(source, where, f"rate {rate!r}: a relative rate is x and a positive factor, e.g. x0.1")
        return Phase(d, factor=f)
    try:
        return Phase(d, rate_bps=parse_rate_bps(text))
    except CaramelError as e:
        raise _error(source, where, f"rate {rate!r}: {e}; or a factor of the configuration's rate, e.g. x0.1") from None


def _phases_from_json(data: Any, source: str) -> list[Phase]:
    if isinstance(data, dict):
        if set(data) != {"phases"}:
            raise _error(source, "", f"expected a list of phases or {{\"phases\": [...]}}, got the keys {sorted(data)}")
        data = data["phases"]
    if not isinstance(data, list):
        raise _error(source, "", f"expected a list of phases, e.g. {EXAMPLE}")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"duration_s", "rate"}:
            got = sorted(item) if isinstance(item, dict) else repr(item)
            raise _error(source, f"phase {i + 1}", f"expected {{\"duration_s\": SECONDS, \"rate\": RATE}}, got {got}")
        out.append(parse_phase(item["duration_s"], item["rate"], source, i))
    return out


def _phases_from_csv(text: str, source: str) -> list[Phase]:
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r) and not r[0].lstrip().startswith("#")]
    if rows and [c.strip().lower() for c in rows[0]] == ["duration_s", "rate"]:
        rows = rows[1:]
    out = []
    for i, row in enumerate(rows):
        if len(row) != 2:
            raise _error(source, f"phase {i + 1}", f"expected two columns, duration_s,rate (e.g. 30,100mbit), got {row}")
        out.append(parse_phase(row[0].strip(), row[1].strip(), source, i))
    return out


def parse_trace(text: str, source: str = "<trace>") -> BandwidthTrace:
    """A trace from the text of a JSON or CSV file (JSON when it starts with `[` or `{`)."""
    body = text.strip()
    if body[:1] in ("[", "{"):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            raise _error(source, "", f"not valid JSON ({e.msg} at line {e.lineno}); expected e.g. {EXAMPLE}") from None
        phases = _phases_from_json(data, source)
    else:
        phases = _phases_from_csv(text, source)
    if not phases:
        raise _error(source, "", f"no phases; expected at least one, e.g. {EXAMPLE}")
    return BandwidthTrace(tuple(phases), source)


def load_trace(path: str | Path) -> BandwidthTrace:
    """`parse_trace` of a file; a missing or unreadable file is one clear error too."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CaramelError(f"--bandwidth-trace {path}: cannot read it ({e.strerror or e})") from None
    return parse_trace(text, str(path))
