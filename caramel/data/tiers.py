"""The memory tier in front of the disk cache, and the counters that say which tier served
each sample.

`MemoryCache` keeps whole shards in the loader worker's own memory, least recently used
evicted first, within `budget_bytes`. It only ever holds bytes that were checked against the
index (fetched from the store or read back from the disk cache, both of which check size and
sha256 before returning), and an entry is inserted whole, after the check, so a shard whose
fetch or read failed part way is never in it. Each loader worker process has its own (a rank's
workers read overlapping shards, so a shard may be held once per worker: the budget is per
process).

`TierCounters` are shared by a rank's loader worker processes (an array in shared memory,
inherited through fork), so the process that drives the loader can read what its workers
fetched: samples served from memory, from the disk cache and from the store (a sample counts
for the tier its shard's bytes came from, also when its shard was already in use), the
store's requests and bytes, and the shard reads from disk.
"""
from __future__ import annotations

import multiprocessing
from collections import OrderedDict
from dataclasses import dataclass

from caramel.errors import CaramelError

FIELDS = ("memory_hits", "disk_hits", "misses", "store_requests", "store_bytes", "disk_reads")


class MemoryCache:
    """Shards by name, at most `budget_bytes` in all, least recently used evicted first."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise CaramelError(f"memory cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.used_bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> bytes | None:
        data = self._entries.get(name)
        if data is not None:
            self._entries.move_to_end(name)
        return data

    def put(self, name: str, data: bytes) -> bool:
        """Keep a checked shard, evicting the least recently used; False if it alone exceeds the budget."""
        if len(data) > self.budget_bytes:
            return False
        old = self._entries.pop(name, None)
        if old is not None:
            self.used_bytes -= len(old)
        while self._entries and self.used_bytes + len(data) > self.budget_bytes:
            _, gone = self._entries.popitem(last=False)
            self.used_bytes -= len(gone)
            self.evictions += 1
        self._entries[name] = data
        self.used_bytes += len(data)
        return True


@dataclass
class TierSnapshot:
    """Counts at one moment; subtract two for what happened in between."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    store_requests: int = 0
    store_bytes: int = 0
    disk_reads: int = 0  # whole shards read back from the disk cache

    def __sub__(self, other: "TierSnapshot") -> "TierSnapshot":
        return TierSnapshot(*(getattr(self, f) - getattr(other, f) for f in FIELDS))

    def __add__(self, other: "TierSnapshot") -> "TierSnapshot":
        return TierSnapshot(*(getattr(self, f) + getattr(other, f) for f in FIELDS))

    @property
    def samples(self) -> int:
        return self.memory_hits + self.disk_hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Share of samples served without the store (memory or disk)."""
        return (self.memory_hits + self.disk_hits) / self.samples if self.samples else 0.0


class TierCounters:
    """Per-sample tier counts and store traffic, shared by the processes forked after it was made."""

    def __init__(self) -> None:
        self._array = multiprocessing.get_context("fork").Array("q", len(FIELDS), lock=True)

    def add(self, tier: str, store_requests: int = 0, store_bytes: int = 0, disk_reads: int = 0) -> None:
        """One sample served by `tier` (memory_hits, disk_hits or misses), with what the store sent
        and the shard reads from disk it took."""
        if self._array is None:
            return
        with self._array.get_lock():
            self._array[FIELDS.index(tier)] += 1
            self._array[3] += store_requests
            self._array[4] += store_bytes
            self._array[5] += disk_reads

    def snapshot(self) -> TierSnapshot:
        if self._array is None:
            return TierSnapshot()
        with self._array.get_lock():
            return TierSnapshot(*self._array[:])

    def __getstate__(self):  # spawned workers cannot share it; they count nothing rather than fail
        return {}

    def __setstate__(self, state) -> None:
        self._array = None
