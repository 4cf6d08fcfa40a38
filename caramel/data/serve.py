"""A small http shard server for tests and benchmarks: a directory served on loopback (or any
address, e.g. inside a network namespace) behind an emulated link.

The link is one token bucket shared by every connection (`rate_bps`: the store's bandwidth,
which all workers share, as a real store's uplink is) plus `latency_s` before each response
(the round trip a request costs). It answers GET and HEAD with byte ranges, which is what
fsspec's http backend sends, and counts requests and bytes served, the benchmark's ground
truth for remote traffic.

    with serve_directory("data/", rate_bps=200e6, latency_s=0.002) as server:
        store = Store(server.url)
"""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

CHUNK_BYTES = 64 * 1024


class Link:
    """A shared token bucket: each chunk waits for its turn on a link of `rate_bps` (None: unshaped)."""

    def __init__(self, rate_bps: float | None, latency_s: float):
        self.rate_bps, self.latency_s = rate_bps, latency_s
        self._lock = threading.Lock()
        self._free_at = 0.0

    def send(self, nbytes: int) -> None:
        if not self.rate_bps:
            return
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + nbytes * 8 / self.rate_bps
            done = self._free_at
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class _Handler(BaseHTTPRequestHandler):
    server: "ShardServer"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and a small body in separate writes would wait for a delayed ACK

    def log_message(self, *args) -> None:  # quiet: benchmarks print their own tables
        pass

    def _target(self) -> Path | None:
        name = self.path.split("?", 1)[0].lstrip("/")
        path = (self.server.root / name).resolve()
        if self.server.root not in path.parents or not path.is_file():
            return None
        return path

    def _range(self, size: int) -> tuple[int, int] | None:
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        if not m:
            return None
        a, b = m.groups()
        if a == "":
            return max(size - int(b), 0), size
        return int(a), min(int(b) + 1 if b else size, size)

    def _respond(self, body: bool) -> None:
        path = self._target()
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = path.stat().st_size
        span = self._range(size)
        start, end = span if span else (0, size)
        if self.server.link.latency_s:
            time.sleep(self.server.link.latency_s)
        self.send_response(206 if span else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if span:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        # counted before each write, not after the last: a client holding every byte must also
        # see them counted (a count after the write raced the client's next look at it)
        self.server.count(0, request=True)
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(CHUNK_BYTES, left))
                self.server.link.send(len(chunk))
                self.server.count(len(chunk))
                self.wfile.write(chunk)
                left -= len(chunk)

    def do_GET(self) -> None:
        self._respond(True)

    def do_HEAD(self) -> None:
        self._respond(False)


class ShardServer(ThreadingHTTPServer):
    """Serves `root` over http through one emulated `Link`."""

    daemon_threads = True

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0,
                 rate_bps: float | None = None, latency_s: float = 0.0):
        self.root = Path(root).resolve()
        self.link = Link(rate_bps, latency_s)
        self.requests_served = 0
        self.bytes_served = 0
        self._count_lock = threading.Lock()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def handle_error(self, request, client_address) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that went away (a loader worker shut down) is not the server's error
        super().handle_error(request, client_address)

    def count(self, nbytes: int, request: bool = False) -> None:
        with self._count_lock:
            self.requests_served += int(request)
            self.bytes_served += nbytes


@contextmanager
def serve_directory(root: str | Path, host: str = "127.0.0.1", port: int = 0, rate_bps: float | None = None,
                    latency_s: float = 0.0) -> Iterator[ShardServer]:
    """Run a ShardServer on a background thread for the duration of the block."""
    server = ShardServer(root, host, port, rate_bps, latency_s)
    thread = threading.Thread(target=server.serve_forever, name="caramel-shard-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
