"""Shared by the RL scheduling experiments: seed ranges, option specs, summaries, and
per-instance ratio summaries with their 95% interval."""
from __future__ import annotations

import numpy as np

from caramel.errors import CaramelError
from caramel.stats import t_interval
from caramel.strategies.options import build_options, parse_spec


def seed_range(text: str) -> list[int]:
    """`1000:1064` -> 1000..1063."""
    lo, sep, hi = text.partition(":")
    try:
        seeds = list(range(int(lo), int(hi))) if sep else [int(lo)]
    except ValueError:
        raise CaramelError(f"seeds {text!r}: expected START:STOP (e.g. 1000:1064) or one integer") from None
    if not seeds:
        raise CaramelError(f"seeds {text!r}: the range is empty")
    return seeds


def parse_fractions(text: str, flag: str) -> list[float]:
    """`0.03,0.1` -> [0.03, 0.1]: distinct fractions in (0, 1]; otherwise an error naming `flag`."""
    try:
        fractions = [float(f) for f in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} must be comma-separated fractions in (0, 1], got {text!r}") from None
    if any(not 0 < f <= 1 for f in fractions) or len({f"{f:g}" for f in fractions}) != len(fractions):
        raise SystemExit(f"{flag} must be distinct fractions in (0, 1], got {text!r}")
    return fractions


def options_from(cls, text: str, what: str):
    """An options dataclass from `key=value,...` (the same parser as strategy specs)."""
    _, values = parse_spec(f"{what}:{text}" if text else what)
    return build_options(cls, values, what)


def summary(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std()), "n": int(arr.size)}


def ratio_summary(ratios: list[float]) -> dict:
    """Mean of per-instance ratios with its 95% t-interval (None below two instances) and the
    worst instance."""
    arr = np.asarray(ratios, dtype=float)
    ci = list(t_interval(arr)[1:]) if arr.size > 1 else None
    return {"mean": float(arr.mean()), "ci95": ci, "max": float(arr.max()), "n": int(arr.size)}
