"""The store's per-request cost under the training load, measured right before each round: the
data side's contention term of the data bench's model.

`request_overhead_s` (the I/O model's CPU per range read) is measured once, alone: one client
reading from an unshaped server while nothing else runs. In the scored steps the requests are
served while the ranks step and their loader workers prefetch on the same cores, and the bench's
server (threads of one Python process) and the workers' clients wait for a core as the training
processes do. So right before each round, while the ranks run that round's contention
calibration (the mode's own loader beside the bench's step, `data_contention`), a thread of the
bench's process times range reads from an unshaped server of the same directory, one read every
`pause_s` so that it adds little load of its own: their median is the round's request time under
load, which the model charges to each read in its worker's sequence of reads
(`DataLoadModel.worker_request_s`: a worker reads its batch's samples one after another, so a read
waiting for a core delays that worker's batch as the store's latency does). The store's serial
work shared by every rank stays the overhead measured alone: a read's time under load is mostly
waiting for a core, during which the other workers' reads proceed, not work that serializes
them. The unshaped server is not the scored store, so its reads are in no mode's remote bytes.

Neither this nor the alone measurement is fitted to the scored steps: both are reads timed
apart from them. The load is the calibration's (the loader over samples in memory), not the
scored mode's own reads, which it does not include.
"""
from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager

from caramel.data.format import DatasetIndex
from caramel.data.store import Store
from caramel.errors import CaramelError
from caramel.stats import median


class OverheadProbe(AbstractContextManager):
    """Times one range read from the store at `url` every `pause_s` in a thread, from entry to
    exit; `overhead_s()` is the median read (None if no read finished)."""

    def __init__(self, url: str, index: DatasetIndex, pause_s: float = 0.01):
        if pause_s < 0:
            raise CaramelError(f"the overhead probe's pause must be >= 0 s, got {pause_s}")
        self._store, self._index, self._pause_s = Store(url), index, pause_s
        self._stop = threading.Event()
        self._times_s: list[float] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="overhead-probe", daemon=True)

    def __enter__(self) -> "OverheadProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None and exc[0] is None:
            raise CaramelError(f"the request-overhead probe failed reading {self._store.url!r}: {self._error}")

    def _run(self) -> None:
        shards, k = self._index.shards, 0
        try:
            while not self._stop.is_set():
                info = shards[k % len(shards)]
                t0 = time.perf_counter()
                self._store.read_sample_bytes(info, (k // len(shards)) % info.num_samples)
                self._times_s.append(time.perf_counter() - t0)
                k += 1
                self._stop.wait(self._pause_s)
        except BaseException as e:  # reported on exit, in the caller's thread
            self._error = e

    def overhead_s(self) -> float | None:
        return median(self._times_s) if self._times_s else None

    def reads(self) -> int:
        return len(self._times_s)


def round_overheads(calibrations: list[dict], alone_s: float = 0.0) -> list[float]:
    """The request time under load of each round: the one measured during the calibration right
    before it, else (a record before the probe, a store the bench does not serve) `alone_s`."""
    out = []
    for c in calibrations:
        loaded = c.get("request_overhead_s")
        out.append(loaded if loaded is not None else alone_s)
    return out
