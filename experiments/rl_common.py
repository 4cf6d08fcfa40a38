"""Shared by the RL scheduling experiments: seed ranges, option specs, summaries, and
per-instance ratio summaries with their 95% interval."""
from __future__ import annotations

import numpy as np
from scipy.stats import t as student_t

from caramel.errors import CaramelError
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
    ci = None
    if arr.size > 1:
        half = float(student_t.ppf(0.975, arr.size - 1) * arr.std(ddof=1) / np.sqrt(arr.size))
        ci = [float(arr.mean() - half), float(arr.mean() + half)]
    return {"mean": float(arr.mean()), "ci95": ci, "max": float(arr.max()), "n": int(arr.size)}
