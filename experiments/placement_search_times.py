"""The local search's own time in an `edge_placement` result: each searched row's mean solve
time minus that of the row it starts from (NAME+search from NAME, NAME+guided:F and
NAME+random:F from NAME, H+search from H), and each row's own time over the plain search's
after the same start. A row's time includes its start (the decode, ~9 ms for the policy on
30 x 8), so the ratio of whole rows understates how much slower one search is than another.
Means over the instances, not per-instance ratios: a search's own time per instance is a
difference of medians, too noisy to divide.

    python -m experiments.placement_search_times docs/results/rl/edge_placement_guided.json
"""
from __future__ import annotations

import argparse

import numpy as np

from caramel.jsonio import read_json

SUFFIXES = ("+search", "+guided:", "+random:")


def start_of(row: str) -> str | None:
    """The row a searched row starts from, None for a row without a search."""
    for suffix in SUFFIXES:
        if suffix in row:
            return row[:row.index(suffix)]
    return None


def search_own_times_ms(section: dict) -> dict[str, dict]:
    """{row: {"start", "own_ms", "over_plain"}} for every searched row of a result's section
    ("small" or "large"): `own_ms` the row's mean time minus its start's, `over_plain` that over
    the own time of START+search (None where that row is missing or took no time)."""
    per = section["solve_s_per_instance"]
    mean_ms = {name: 1e3 * float(np.mean(times)) for name, times in per.items()}
    own = {row: mean_ms[row] - mean_ms[start] for row in per
           if (start := start_of(row)) is not None and start in mean_ms}
    rows = {}
    for row, ms in own.items():
        plain = own.get(start_of(row) + "+search")
        rows[row] = {"start": start_of(row), "own_ms": ms,
                     "over_plain": ms / plain if plain is not None and plain > 0 else None}
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="an edge_placement --json result")
    ap.add_argument("--section", default="large", choices=("small", "large"))
    args = ap.parse_args(argv)
    report = read_json(args.json, "edge-placement")
    if args.section not in report:
        raise SystemExit(f"{args.json}: no {args.section!r} section")
    for row, v in search_own_times_ms(report[args.section]).items():
        ratio = "" if v["over_plain"] is None else f", {v['over_plain']:.2f} times {v['start']}+search's"
        print(f"{row:26s} the search alone {v['own_ms']:.2f} ms (the row minus {v['start']}){ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
