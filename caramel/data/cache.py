"""Each worker's shard cache: whole shards on its local disk, within a byte budget, least
recently used evicted first.

Entries are written atomically (temporary file, sync, rename) and checked against the index's
sha256 when read back, so a half-written or damaged entry is never returned: it is dropped and
the shard fetched again. Recency is the file's mtime (touched on each hit), so several loader
worker processes can share one directory and the sampler in the main process sees what they
cached. A directory without room for the budget is an error naming it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from caramel.data.format import DataError, ShardInfo, check_shard
from caramel.errors import CaramelError
from caramel.jsonio import atomic_write_bytes


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_read_local: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class ShardCache:
    """Shards by name under `directory`, at most `budget_bytes` in all."""

    def __init__(self, directory: str | os.PathLike, budget_bytes: int, check_space: bool = True):
        if budget_bytes < 0:
            raise CaramelError(f"cache budget must be >= 0 bytes, got {budget_bytes}")
        self.directory = Path(directory)
        self.budget_bytes = int(budget_bytes)
        self.stats = CacheStats()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CaramelError(f"cache directory {str(self.directory)!r} cannot be created ({e.strerror})") from None
        if not os.access(self.directory, os.W_OK):
            raise CaramelError(f"cache directory {str(self.directory)!r} is not writable")
        if check_space:
            free = shutil.disk_usage(self.directory).free + self.used_bytes()
            if free < self.budget_bytes:
                raise CaramelError(f"cache directory {str(self.directory)!r} has {free} bytes free, "
                                   f"less than the cache budget of {self.budget_bytes} bytes; lower the budget or free space")

    def _entries(self) -> list[tuple[str, int, int]]:
        """(name, size, mtime_ns) of every entry; one another worker evicts meanwhile is left out."""
        out = []
        for e in os.scandir(self.directory):
            if e.name.startswith("."):
                continue  # temporary files of writes in progress
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            out.append((e.name, st.st_size, st.st_mtime_ns))
        return out

    def used_bytes(self) -> int:
        return sum(size for _, size, _ in self._entries()) if self.directory.is_dir() else 0

    def names(self) -> set[str]:
        """The shards cached now."""
        return {name for name, _, _ in self._entries()}

    def get(self, info: ShardInfo, recheck: bool = False) -> bytes | None:
        """The cached shard, or None (a miss); a damaged entry is removed and counts as a miss.
        `recheck`: a second look after waiting for the fetch lock, whose miss was counted already."""
        path = self.directory / info.name
        try:
            inode = os.stat(path).st_ino
            data = path.read_bytes()
        except FileNotFoundError:  # not cached, or evicted; never unlink here: another worker's
            self.stats.misses += 0 if recheck else 1  # write may land between the miss and an unlink
            return None
        try:
            check_shard(info, data, str(path))
        except DataError:
            _unlink_if_same(path, inode)  # damaged: removed, unless a fresh copy replaced it meanwhile
            self.stats.misses += 0 if recheck else 1
            return None
        try:
            _touch(path)
        except FileNotFoundError:
            pass  # evicted after the read: the bytes read are whole and checked
        self.stats.hits += 1
        self.stats.bytes_read_local += len(data)
        return data

    @contextmanager
    def fetching(self, info: ShardInfo) -> Iterator[None]:
        """Hold the shard's fetch lock: a rank's loader workers read the same shards at about the
        same time, and without it each would fetch a missing shard from the store itself."""
        with open(self.directory / f".{info.name}.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _evict(self, name: str, listed_mtime_ns: int) -> str:
        """Remove a least recent entry of the listing put() made: "evicted", "gone" (another worker
        evicted it first) or "kept". The listing is stale by the time the loop reaches an entry,
        so the entry is removed only under its fetch lock (no worker writes a fresh copy
        meanwhile; one fetching it now holds the lock: kept) and only if it is unchanged since
        the listing (read since, or rewritten: no longer the least recent; kept)."""
        with open(self.directory / f".{name}.lock", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return "kept"
            try:
                path = self.directory / name
                if os.stat(path).st_mtime_ns != listed_mtime_ns:
                    return "kept"
                os.unlink(path)
                return "evicted"
            except FileNotFoundError:
                return "gone"
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def put(self, info: ShardInfo, data: bytes) -> bool:
        """Keep a shard, evicting the least recently used ones to stay within budget; False if it cannot fit.
        An entry another worker fetches or reads meanwhile is not evicted (`_evict`): the next least
        recent goes instead, and when none can go the cache is over budget until a later put."""
        if len(data) > self.budget_bytes:
            return False
        entries = sorted(self._entries(), key=lambda e: e[2])
        used = sum(size for _, size, _ in entries)
        for name, size, mtime_ns in entries:
            if used + len(data) <= self.budget_bytes:
                break
            if name == info.name:
                continue
            outcome = self._evict(name, mtime_ns)
            if outcome != "kept":
                used -= size
            self.stats.evictions += outcome == "evicted"
        try:
            atomic_write_bytes(self.directory / info.name, data)
        except OSError as e:
            raise CaramelError(f"cache directory {str(self.directory)!r}: cannot write {info.name} ({e.strerror})") from None
        try:
            _touch(self.directory / info.name)
        except FileNotFoundError:
            pass  # another worker evicted it between the rename and the touch: kept, then evicted
        return True


def _unlink_if_same(path: Path, inode: int) -> None:
    """Remove `path` if it is still the file whose inode was `inode`."""
    try:
        if os.stat(path).st_ino == inode:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass


def _touch(path: Path) -> None:
    """Mark `path` most recently used. The time is given explicitly: file systems stamp files with a
    coarse clock (milliseconds), which would tie shards read one after another."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))
