"""Where a dataset lives: any fsspec URL (a local path, file://, http(s)://, s3:// with s3fs).

A `Store` reads the index, whole shards (one request each) and single samples (range reads),
and counts the requests and bytes it fetched, which is what the benchmark reports as remote
traffic. It pickles as its URL alone, so DataLoader worker processes open their own
connections. An unreachable URL or a missing file is one CaramelError naming the URL.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from caramel.data.format import INDEX_NAME, DatasetIndex, ShardInfo, check_shard
from caramel.errors import CaramelError


@dataclass
class StoreStats:
    requests: int = 0
    bytes_fetched: int = 0


@dataclass
class Store:
    """A dataset directory at `url`, read through fsspec."""

    url: str
    stats: StoreStats = field(default_factory=StoreStats)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self._fs: Any = None
        self._pid = 0
        self._root = ""
        self._index: DatasetIndex | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "stats": StoreStats(), "_index": self._index}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.stats = state["url"], state["stats"]
        self._fs, self._pid, self._root, self._index = None, 0, "", state["_index"]

    def _filesystem(self):
        if self._fs is None or self._pid != os.getpid():
            import fsspec

            self._pid = os.getpid()  # a forked loader worker opens its own: fsspec's http is not fork-safe

            protocol = self.url.split("://", 1)[0] if "://" in self.url else "file"
            try:
                # a private instance: fsspec's shared ones carry event loops that do not survive a fork
                self._fs = fsspec.filesystem(protocol, skip_instance_cache=True)
            except (ImportError, ValueError) as e:
                raise CaramelError(f"data store {self.url!r}: protocol {protocol!r} is not available ({e}); "
                                   f"install its fsspec backend (aiohttp for http, s3fs for s3)") from None
            self._root = self.url if protocol in ("http", "https") else self.url.split("://", 1)[-1]
        return self._fs

    def _path(self, name: str) -> str:
        self._filesystem()
        return f"{self._root}/{name}"

    def _cat(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        fs = self._filesystem()
        path = self._path(name)
        try:
            data = fs.cat_file(path, start=start, end=end)
        except FileNotFoundError:
            raise CaramelError(f"data store {self.url!r}: {name} is not there") from None
        except Exception as e:  # connection refused, DNS, timeouts: the backends raise their own kinds
            raise CaramelError(f"data store {self.url!r}: cannot read {name} ({type(e).__name__}: {str(e)[:120]})") from None
        self.stats.requests += 1
        self.stats.bytes_fetched += len(data)
        return data

    def index(self) -> DatasetIndex:
        """The dataset's index (read once, then kept)."""
        if self._index is None:
            self._index = DatasetIndex.parse(self._cat(INDEX_NAME), f"{self.url}/{INDEX_NAME}")
        return self._index

    def with_index(self, index: DatasetIndex) -> "Store":
        """This store with `index` as its index, already read elsewhere: nothing is read for it."""
        self._index = index
        return self

    def read_shard(self, info: ShardInfo) -> bytes:
        """A whole shard, checked against its size and sha256."""
        return check_shard(info, self._cat(info.name), f"{self.url}/{info.name}")

    def read_sample_bytes(self, info: ShardInfo, position: int) -> bytes:
        """One sample's bytes by a range read (what a loader without a shard cache does)."""
        start, end = info.offsets[position], info.offsets[position + 1]
        data = self._cat(info.name, start, end)
        if len(data) != end - start:
            raise CaramelError(f"data store {self.url!r}: {info.name} bytes {start}-{end} came back as {len(data)} bytes")
        return data
