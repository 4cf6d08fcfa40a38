"""The store's per-request cost under the training load, measured right before each round: the
data side's contention term of the data bench's model.

`request_overhead_s` (the I/O model's CPU per range read) is measured once, alone: one client
reading from an unshaped server while nothing else runs. In the scored steps the requests are
served while the ranks step and their loader workers prefetch on the same cores, and the bench's
server (threads of one Python process) and the workers' clients wait for a core as the training
processes do. So right before each round, while the ranks run that round's contention
calibration (the mode's own loader beside the bench's step, `data_contention`), a thread of the
bench's process times range reads from an unshaped server of the same directory, one read every
`pause_s`. It reads only inside a window rank 0 opens and closes around the steps of the
calibration's first, untimed pass after its warm-up (`data_contention.steady_steps`): the same
loaded steps as the timed pass, but not the alone steps, the workers' start-up or shut-down, and
the probe's own load stays out of the timed pass that gives the contention factor. Only reads
inside the window (monotonic clock, system-wide) count: their median is the round's request time
under load, which the model charges to each read in its worker's sequence of reads
(`DataLoadModel.worker_request_s`: a worker reads its batch's samples one after another, so a read
waiting for a core delays that worker's batch as the store's latency does). The store's serial
work shared by every rank stays the overhead measured alone: a read's time under load is mostly
waiting for a core, during which the other workers' reads proceed, not work that serializes
them. The unshaped server is not the scored store, so its reads are in no mode's remote bytes.
The term applies to range reads only (the plain loader); with `--network cluster` the store runs
on another host, whose server this probe cannot time, and the bench runs no probe.

Neither this nor the alone measurement is fitted to the scored steps: both are reads timed
apart from them. The load is the calibration's (the loader over samples in memory), not the
scored mode's own reads, which it does not include.
"""
from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from statistics import fmean, variance
from typing import Any

from caramel.data.format import DatasetIndex
from caramel.data.store import Store
from caramel.errors import CaramelError
from caramel.stats import median


class OverheadProbe(AbstractContextManager):
    """Times one range read from the store at `url` every `pause_s` in a thread, from entry to
    exit, and with a `gate` (an Event, e.g. a multiprocessing one) only while it is set;
    `overhead_s(window)` is the median read inside `window` (None if no read finished there)."""

    def __init__(self, url: str, index: DatasetIndex, pause_s: float = 0.01, gate: Any = None):
        if not pause_s >= 0:  # NaN too: Event.wait(nan) would fail in the thread
            raise CaramelError(f"the overhead probe's pause must be >= 0 s, got {pause_s}")
        if not index.shards or any(info.num_samples < 1 for info in index.shards):
            raise CaramelError("the overhead probe reads samples: the store's index has no shards or an empty shard")
        self._store, self._index, self._pause_s, self._gate = Store(url), index, pause_s, gate
        self._stop = threading.Event()
        self._reads: list[tuple[float, float]] = []  # (monotonic start, duration), both s
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
                if self._gate is not None and not self._gate.wait(max(self._pause_s, 1e-3)):
                    continue  # outside the window: no read, no load
                info = shards[k % len(shards)]
                t0 = time.monotonic()
                self._store.read_sample_bytes(info, (k // len(shards)) % info.num_samples)
                self._reads.append((t0, time.monotonic() - t0))
                k += 1
                self._stop.wait(self._pause_s)
        except BaseException as e:  # reported on exit, in the caller's thread
            self._error = e

    def _inside(self, window: tuple[float, float] | None) -> list[float]:
        if window is None:
            return [d for _, d in self._reads]
        start, end = window
        return [d for t, d in self._reads if t >= start and t + d <= end]

    def overhead_s(self, window: tuple[float, float] | None = None) -> float | None:
        """The median read that started and ended inside `window` (monotonic s; None: all reads)."""
        inside = self._inside(window)
        return median(inside) if inside else None

    def reads(self, window: tuple[float, float] | None = None) -> int:
        return len(self._inside(window))

    def durations_s(self, window: tuple[float, float] | None = None) -> list[float]:
        """Every read inside `window`, in the order they started: the spread around the median, which
        a queue at the store's link depends on (docs/data.md, "The 100 Mbit/s read slope")."""
        return self._inside(window)


def round_overheads(calibrations: list[dict]) -> list[float]:
    """The request time under load of each round, measured during the calibration right before it
    (`request_s_under_load`; `request_overhead_s` in caramel.data-bench/4 records); 0.0, the term
    off, where a round has none (a record before the probe, a store the bench cannot probe, a
    window in which no read finished: `request_s_under_load_reads` 0)."""
    out = []
    for c in calibrations:
        loaded = c.get("request_s_under_load", c.get("request_overhead_s"))
        out.append(loaded if loaded is not None else 0.0)
    return out


def round_read_spreads(calibrations: list[dict]) -> list[tuple[float, float | None]]:
    """Each round's (read time under load, the reads' SCV) for the I/O model when the link queue is
    to be scaled by the reads' spread (`round_models(..., read_spreads=True)`): where the probe kept
    at least two reads (`request_s_under_load_each`, caramel.data-bench/6) their mean and squared
    coefficient of variation (sample variance / mean^2), the queue's arrivals' spread (docs/data.md,
    "The knee's queue"); otherwise the round's median as `round_overheads` gives it and None (the
    spread unmeasured: the model charges the queue as before)."""
    out = []
    for c, median_s in zip(calibrations, round_overheads(calibrations)):
        each = c.get("request_s_under_load_each") or []
        mean_s = fmean(each) if len(each) >= 2 else 0.0
        out.append((mean_s, variance(each) / mean_s ** 2) if mean_s > 0 else (median_s, None))
    return out


def probed_calibration(calibration: dict, probe: OverheadProbe) -> dict:
    """`calibration` with the probe's reads inside its window (`loaded.probe_window_s`, rank 0's
    first pass after the warm-up): `request_s_under_load` (None, the term off for the round, when
    no read finished there; `request_s_under_load_reads` says 0), every read's time
    (`request_s_under_load_each`, for models of the reads' spread) and the window's bounds."""
    bounds = (calibration.get("loaded") or {}).get("probe_window_s")
    window = tuple(bounds) if bounds else (float("inf"), float("-inf"))  # no window: no read counts
    return dict(calibration, request_s_under_load=probe.overhead_s(window),
                request_s_under_load_reads=probe.reads(window),
                request_s_under_load_each=probe.durations_s(window),
                probe_window_length_s=(bounds[1] - bounds[0]) if bounds else None)
