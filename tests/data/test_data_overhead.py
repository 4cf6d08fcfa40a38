"""The data side's contention term: a range read timed under each round's calibration load,
charged to each read in its loader worker's sequence for that round."""
import threading
import time

import os

import pytest

from caramel.bench.data_contention import steady_steps
from caramel.bench.data_overhead import OverheadProbe, probed_calibration, round_overheads, round_read_spreads
from caramel.data.format import DatasetIndex, write_random_dataset
from caramel.data.serve import serve_directory
from caramel.data.store import Store
from caramel.errors import CaramelError
from caramel.stats import median


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("overhead-store")
    write_random_dataset(root, 32, 2048, 8)
    return root


def test_a_round_without_a_probe_read_charges_nothing():
    cals = [{"request_s_under_load": 2e-3}, {"request_s_under_load": None, "request_s_under_load_reads": 0},
            {"alone_s": 1e-3}, {"request_overhead_s": 3e-3}]  # the last: a caramel.data-bench/4 calibration
    assert round_overheads(cals) == [2e-3, 0.0, 0.0, 3e-3]


def test_a_round_that_kept_its_reads_gives_their_mean_and_scv_the_others_as_before():
    """Reads 1, 2, 3 ms: mean 2 ms, sample variance 1 ms^2, SCV 1/4; a round with one read, none or
    an older record's median keeps the median and no spread (the queue charged as before)."""
    each = {"request_s_under_load": 2.5e-3, "request_s_under_load_each": [1e-3, 2e-3, 3e-3]}
    one = {"request_s_under_load": 2e-3, "request_s_under_load_each": [2e-3]}
    cals = [each, one, {"request_s_under_load": 2e-3}, {"request_s_under_load": None, "request_s_under_load_each": []},
            {"request_overhead_s": 3e-3}]
    spreads = round_read_spreads(cals)
    assert spreads[0][0] == pytest.approx(2e-3) and spreads[0][1] == pytest.approx(0.25)
    assert spreads[1:] == [(2e-3, None), (2e-3, None), (0.0, None), (3e-3, None)]


@pytest.mark.timeout(30)
def test_the_probe_times_range_reads_until_it_exits(store):
    index = Store(str(store)).index()
    with serve_directory(store) as server:
        with OverheadProbe(server.url, index, pause_s=0.001) as probe:
            while probe.reads() < 5:
                time.sleep(0.005)
        served = server.requests_served
    assert probe.reads() >= 5 and served == probe.reads()  # one request per read (and the index, none here)
    assert 0 < probe.overhead_s() < 1.0
    for bad in (-1, float("nan")):
        with pytest.raises(CaramelError, match="pause"):
            OverheadProbe(server.url, index, pause_s=bad)
    with pytest.raises(CaramelError, match="no shards"):
        OverheadProbe(server.url, DatasetIndex(shards=()))


class _CountedGate(threading.Event):
    """The probe's gate, counting the checks the probe's thread found it closed (it then reads
    nothing until its next check), so a test waits on the thread's progress, not on the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.closed_checks = 0
        self._seen = threading.Condition()

    def wait(self, timeout=None) -> bool:
        opened = super().wait(timeout)
        if not opened:
            with self._seen:
                self.closed_checks += 1
                self._seen.notify_all()
        return opened

    def reaches(self, checks: int, timeout_s: float = 10.0) -> bool:
        """Whether `checks` closed checks happen within `timeout_s` (False: the probe stopped checking)."""
        with self._seen:
            return self._seen.wait_for(lambda: self.closed_checks >= checks, timeout_s)


@pytest.mark.timeout(30)
def test_a_gated_probe_reads_only_inside_its_window(store):
    """Rank 0 opens the window over its unscored loaded steps: no read outside it (no load on the
    timed pass), and only the reads that started and ended inside it count. Paced by the probe's
    own gate checks (no sleeps to outlast a read: under load a read can take any time)."""
    index = Store(str(store)).index()
    gate = _CountedGate()
    with serve_directory(store) as server:
        with OverheadProbe(server.url, index, pause_s=0.001, gate=gate) as probe:
            assert gate.reaches(3)  # the thread checked the closed gate three times
            assert probe.reads() == 0 and server.requests_served == 0  # closed: nothing read
            start = time.monotonic()
            gate.set()
            while probe.reads() < 5:
                time.sleep(0.005)
            gate.clear()
            end = time.monotonic()
            closed = gate.closed_checks
            assert gate.reaches(closed + 1)  # seen closed: a read in flight at the clear has ended
            after = probe.reads()
            assert gate.reaches(closed + 4)
            assert probe.reads() == after  # closed again: no more reads
            later = time.monotonic()
    assert probe.reads((start, end)) >= 5 and probe.overhead_s((start, end)) > 0
    assert probe.reads((later, later + 1.0)) == 0 and probe.overhead_s((later, later + 1.0)) is None
    # the record: a window with no read says so, and its round is charged nothing
    empty = probed_calibration({"loaded": {"probe_window_s": [later, later + 1.0]}}, probe)
    assert empty["request_s_under_load"] is None and empty["request_s_under_load_reads"] == 0
    assert round_overheads([empty]) == [0.0]
    inside = probed_calibration({"loaded": {"probe_window_s": [start, end]}}, probe)
    assert inside["request_s_under_load"] == probe.overhead_s((start, end)) and inside["probe_window_length_s"] > 0
    each = inside["request_s_under_load_each"]  # every read in the window: the median's spread is kept
    assert len(each) == inside["request_s_under_load_reads"] >= 4
    assert median(each) == inside["request_s_under_load"]
    assert empty["request_s_under_load_each"] == []
    assert probed_calibration({"loaded": None}, probe)["request_s_under_load_reads"] == 0  # no loaded pass: no window


def test_the_window_spans_the_first_pass_after_its_warm_up_only():
    from caramel.bench.data_contention import WARMUP_STEPS

    gate, seen = threading.Event(), []
    out = steady_steps([0] * 6, 6, 0.0, lambda: seen.append(gate.is_set()), gate)
    assert seen == [False] * WARMUP_STEPS + [True] * (6 - WARMUP_STEPS) + [False] * 6
    start, end = out["probe_window_s"]
    assert start <= end and not gate.is_set()
    assert "probe_window_s" not in steady_steps([0] * 6, 6, 0.0, lambda: None)


@pytest.mark.timeout(30)
def test_a_probe_that_cannot_read_is_named(store):
    index = Store(str(store)).index()
    with serve_directory(store) as server:
        url = server.url
    with pytest.raises(CaramelError, match="request-overhead probe failed reading"):
        with OverheadProbe(url, index):
            pass


def test_each_round_charges_its_read_time_under_load_to_the_workers_sequences(store):
    """A plain-loader round whose reads take longer under load is predicted slower: each worker
    reads its batch one sample after another, so the read's time adds to the latency it waits."""
    from dataclasses import replace

    from caramel.bench.data_bench import DataBenchConfig, ModeResult
    from caramel.bench.data_report import summarize

    index = Store(str(store)).index()
    cfg = DataBenchConfig(ranks=2, batch_size=4, loader_workers=2, epochs=2, rounds=3, compute_s=4e-3,
                          store_rate_bps=1e9, store_latency_s=1e-3, modes=("remote",))
    steps = 32 // 2 // 4
    tiers = {"memory_hits": 0, "disk_hits": 0, "misses": 32, "store_requests": 32, "store_bytes": index.nbytes,
             "disk_reads": 0}
    under_load = [1e-3, 4e-3, 2e-3]
    r = ModeResult("remote", epoch_step_s=[[8e-3] * steps] * 6, epoch_wait_s=[1e-3] * 6, epoch_sync_s=[1e-3] * 6,
                   epoch_tiers=[tiers] * 6, epoch_remote_bytes=[index.nbytes] * 6, epoch_requests=[32] * 6,
                   calibrations=[{"mode": "remote", "round": k, "alone_s": 4e-3, "loaded": {"step_s": 4e-3},
                                  "request_s_under_load": o} for k, o in enumerate(under_load)])
    costs = {"local_s_per_sample": 0.0, "disk_s_per_read": 0.0, "batch_s_pipe": 0.0, "batch_s_shared": 0.0,
             "request_overhead_s": 5e-4, "compute_comm_s": 4e-3, "loaded": {"step_s": 4e-3}}
    report = summarize(cfg, {"remote": r}, index, costs, (0, 0), "test", True)
    (row,) = report["rows"]
    # each round's model is the mode's inputs with that round's read under load: 2 ranks x 2 workers
    # reading 4 samples each per batch, 1 ms latency + the read, then a 0.5 ms turn at the store (its
    # serial work alone, longer than the 65 kB's 0.5 ms at 1 Gbit/s); 4 steps per epoch
    from caramel.data.io_model import DataLoadModel

    model = DataLoadModel(sample_bytes=index.nbytes / 32, batch_size=4, ranks=2, store_bandwidth_bps=1e9,
                          store_latency_s=1e-3, loader_workers=2, request_overhead_s=5e-4,
                          cores_per_rank=max((os.cpu_count() or 1) / 2, 1.0), epoch_steps=4)
    expected = [replace(model, worker_request_s=o).step_time_s(4e-3) for o in under_load]
    assert row["predicted_step_s_rounds"] == pytest.approx(expected, rel=1e-9)
    # a longer read, a longer step: past the store's 4 ms (2 ranks x 4 x 0.5 ms) the workers' sequences set it
    assert expected[0] < expected[2] < expected[1] and expected[1] > 4 * (1e-3 + 4e-3) / 2
    assert row["predicted_step_s"] == pytest.approx(expected[2]) and row["request_s_under_load"] == 2e-3
    assert row["prediction_error"] == pytest.approx(expected[2] / 8e-3 - 1)
    # without the term: the sequence is the latency alone
    assert row["predicted_step_s_overhead_alone"] == pytest.approx(model.step_time_s(4e-3))
    assert model.step_time_s(4e-3) < expected[0]
    assert row["request_s_under_load_charged"] and row["rounds_without_probe_reads"] == 0
    # a mode fetching whole shards: the probe timed one sample's read, not a shard's fetch, so no term
    cached = replace(r, mode="cached")
    cfg = replace(cfg, modes=("cached",))
    (row,) = summarize(cfg, {"cached": cached}, index, costs, (index.nbytes, 0), "test", True)["rows"]
    assert row["request_s_under_load"] == 2e-3 and not row["request_s_under_load_charged"]
    assert row["predicted_step_s_rounds"] == pytest.approx([row["predicted_step_s_overhead_alone"]] * 3, rel=1e-12)
