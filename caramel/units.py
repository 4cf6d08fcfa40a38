"""Parsing of rates, sizes and durations as users type them (`1gbit`, `25mb`, `500ms`).

Rates follow tc's conventions: `bit`/`kbit`/`mbit`/`gbit`/`tbit` are bits per second
(decimal), `bps`/`kbps`/`mbps`/`gbps` are *bytes* per second, as tc reads them.
"""
from __future__ import annotations

import math
import re

from caramel.errors import CaramelError

_RATE_UNITS = {
    "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
}
_SIZE_UNITS = {
    "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def _parse(text: str, units: dict[str, float], what: str, example: str, default_unit: str | None) -> float:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        if not math.isfinite(value) or value <= 0:
            raise CaramelError(f"{what} must be a positive number, got {text!r} (e.g. {example})")
        return value * (units[default_unit] if default_unit else 1.0)
    m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]*)", str(text).strip())
    if not m:
        raise CaramelError(f"{what} {text!r} is not understood; expected a number with a unit, e.g. {example} (units: {', '.join(units)})")
    number, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        if default_unit is None:
            raise CaramelError(f"{what} {text!r} has no unit; expected e.g. {example} (units: {', '.join(units)})")
        unit = default_unit
    if unit not in units:
        raise CaramelError(f"{what} {text!r} has unknown unit {unit!r}; expected one of {', '.join(units)} (e.g. {example})")
    value = number * units[unit]
    if not math.isfinite(value) or value <= 0:
        raise CaramelError(f"{what} must be positive, got {text!r} (e.g. {example})")
    return value


def parse_rate_bps(text: str | float) -> float:
    """A link rate in bits per second from tc syntax (`100mbit`, `1gbit`, `12.5mbps`)."""
    return _parse(text, _RATE_UNITS, "bandwidth", "1gbit or 500mbit", None)


def parse_size_bytes(text: str | float) -> int:
    """A size in bytes (`25mb`, `4MiB`, `1000`)."""
    return int(_parse(text, _SIZE_UNITS, "size", "25mb or 4MiB", "b"))


def parse_duration_s(text: str | float) -> float:
    """A duration in seconds (`500ms`, `2s`, `5m`, or a bare number of seconds)."""
    return _parse(text, _TIME_UNITS, "duration", "500ms or 30s", "s")


_FLAG_DURATION = re.compile(r"([-+]?)([0-9]*\.?[0-9]+)((?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)")
_FLAG_DURATION_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_duration_arg_s(text: str, flag: str) -> float:
    """A duration >= 0 given to a command-line `flag`, in s, ms or us (`0`, `50us`, `1.2ms`), or one
    error naming the flag. A bare nonzero number is refused rather than read as seconds: the
    benches and probes print these times in ms and us, and 1.2 (or 1.2m) meant as milliseconds
    would otherwise make every message or read a thousand (or 60,000) times too slow without a
    word. Any zero, bare or in s, ms or us (`0`, `0.0`, `0ms`, `-0`, `+0us`), is 0; a leading `+`
    is read the same on any number. Zero is told from the digits, not the float, so a positive
    time too small for a float (`1e-400ms`) is refused rather than turned off."""
    units = ", ".join(_FLAG_DURATION_UNITS)
    expected = f"expected a duration >= 0 with its unit ({units}), such as 1.2ms or 800us"
    m = _FLAG_DURATION.fullmatch(str(text).strip())
    if not m:
        raise CaramelError(f"{flag} {text!r} is not understood; {expected}")
    sign, digits, exponent, unit = m.group(1), m.group(2), m.group(3), m.group(4).lower()
    zero = not digits.strip("0.")
    if not unit:
        if zero:
            return 0.0
        raise CaramelError(f"{flag} {text!r} has no unit; {expected}")
    if unit not in _FLAG_DURATION_UNITS:
        raise CaramelError(f"{flag} {text!r}: expected a duration >= 0 in {units}, such as 1.2ms or 800us "
                           f"(not {unit!r})")
    if zero:
        return 0.0
    if sign == "-":
        raise CaramelError(f"{flag} {text!r} is negative; {expected}")
    value = float(digits + exponent) * _FLAG_DURATION_UNITS[unit]
    if not math.isfinite(value) or value == 0:
        raise CaramelError(f"{flag} {text!r} is out of range (a float holds it as {value}); {expected}")
    return value


def format_rate(bps: float) -> str:
    """A rate in tc syntax that `parse_rate_bps` reads back exactly for round numbers."""
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            value = bps / scale
            return f"{value:g}{unit}"
    return f"{bps:g}bit"


def format_bytes(n: float) -> str:
    """Human-readable bytes (`1.5 MB`)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
