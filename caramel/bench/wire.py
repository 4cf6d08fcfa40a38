"""Bytes on the wire per strategy, measured from the worker's network interfaces.

On the emulated cluster every worker runs in a network namespace of its own, so the transmit
counters of that namespace's interfaces (`/proc/self/net/dev`, loopback left out) count exactly
the bytes this worker put on its link: payload, TCP/IP headers and acknowledgements, whatever
the strategy sends (gradients, activations, parameters, barriers). Read before and after each
measured block, they give each strategy's bytes per step; the report divides by the samples a
step trains. On shared loopback the counters hold every process of the host, so nothing is
measured there (None).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


def namespace_tx_bytes(path: str = "/proc/self/net/dev") -> int | None:
    """Bytes transmitted by this network namespace's interfaces other than `lo` (None: unreadable)."""
    try:
        lines = open(path).read().splitlines()[2:]
    except OSError:
        return None
    total = 0
    for line in lines:
        name, _, fields = line.partition(":")
        if name.strip() != "lo":
            total += int(fields.split()[8])  # receive has 8 columns, then transmit bytes
    return total


class WireMeter:
    """Per strategy: transmitted bytes and steps, over the blocks counted."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.steps: dict[str, int] = {}

    @contextmanager
    def count(self, name: str, steps: int) -> Iterator[None]:
        before = namespace_tx_bytes()
        yield
        after = namespace_tx_bytes()
        if before is not None and after is not None:
            self.bytes[name] = self.bytes.get(name, 0) + after - before
            self.steps[name] = self.steps.get(name, 0) + steps

    def totals(self) -> dict[str, dict[str, int]]:
        return {n: {"bytes": b, "steps": self.steps[n]} for n, b in self.bytes.items()}


def merge_ranks(per_rank: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """Every rank's totals summed (the job's bytes); a strategy's steps are the same on every rank."""
    out: dict[str, dict[str, int]] = {}
    for totals in per_rank:
        for name, t in totals.items():
            o = out.setdefault(name, {"bytes": 0, "steps": t["steps"]})
            o["bytes"] += t["bytes"]
    return out
