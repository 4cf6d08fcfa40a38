"""The data bench's contention calibration: the factor from its step against the parts measured
alone, the calibration's steps themselves (one process, a real loader worker), and each mode's
own calibration (its loader's class and workers, no store read, a factor per round)."""
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from caramel.bench.data_contention import (WARMUP_STEPS, alone_floor_s, calibration_order, calibration_shards, contention_factor,
                                           epoch_start_excess_s, loaded_steps, mode_calibration_loader, round_inputs,
                                           steady_steps)
from caramel.data.format import write_dataset
from caramel.data.loader import _stateful_loader_class
from caramel.data.serve import serve_directory
from caramel.data.store import Store
from caramel.data.tiers import TierCounters
from caramel.errors import CaramelError


def test_the_factor_is_the_loaded_step_over_its_parts_alone():
    # compute + all-reduce 5 ms alone, the batch's trip 1 ms alone; 7.5 ms beside busy workers
    assert contention_factor(7.5e-3, 5e-3, 1e-3) == pytest.approx(1.25)
    assert contention_factor(6e-3, 5e-3, 1e-3) == 1.0  # no slower: no contention
    assert contention_factor(5.5e-3, 5e-3, 1e-3) == 1.0  # faster than alone is noise, not a speedup
    assert contention_factor(None, 5e-3, 1e-3) == 1.0 and contention_factor(7e-3, None, 1e-3) == 1.0  # not measured


class _SlowRestart:
    """A loader whose every pass after the first takes `restart_s` to start, inside `iter()` itself
    as a warm torch DataLoader's resume does, and that records how far each pass was read."""

    def __init__(self, batches: int, restart_s: float) -> None:
        self.batches, self.restart_s, self.read = batches, restart_s, []

    def __iter__(self):
        # eager, not a generator: the restart is paid where iter() is called, timed or not
        if self.read:
            time.sleep(self.restart_s)
        self.read.append(0)
        return self._batches()

    def _batches(self):
        for i in range(self.batches):
            self.read[-1] = i + 1
            yield i


def test_the_restart_pass_times_a_new_iterator_inside_its_first_step():
    # a scored epoch's start (iter() over warm workers) is inside its first wait; the calibration's
    # second pass times its restart the same way, after running the first pass to its end
    loader = _SlowRestart(WARMUP_STEPS + 5, restart_s=0.03)
    out = steady_steps(loader, WARMUP_STEPS + 4, 0.0, lambda: None)
    assert loader.read == [WARMUP_STEPS + 5, WARMUP_STEPS + 4]  # the first pass drained before the restart
    assert len(out["restart_step_s"]) == WARMUP_STEPS and out["restart_step_s"][0] >= 0.03
    assert out["step_s"] < 0.01  # the steady mean leaves the restart out
    assert epoch_start_excess_s(out) == pytest.approx(sum(out["restart_step_s"]) - WARMUP_STEPS * out["step_s"])
    assert epoch_start_excess_s(out) >= 0.03 - WARMUP_STEPS * out["step_s"] > 0.01  # the 30 ms restart, less steady steps
    assert epoch_start_excess_s({"step_s": 1.0}) is None and epoch_start_excess_s(None) is None  # not measured


@pytest.mark.timeout(60)
def test_loaded_steps_time_the_benchs_step_beside_a_worker():
    samples = [(torch.full((64,), float(i)), torch.tensor(i)) for i in range(8)]
    calls = []

    def sync():
        calls.append(1)
        time.sleep(1e-3)

    out = loaded_steps(samples, batch_size=4, loader_workers=1, prefetch_factor=2, steps=WARMUP_STEPS + 6,
                       compute_s=2e-3, sync=sync)
    assert len(calls) == WARMUP_STEPS + 6  # every step's all-reduce, warm-up included (the ranks stay in step)
    assert out["compute_s"] >= 2e-3 and out["sync_s"] >= 1e-3 and out["wait_s"] > 0
    # a step is its wait, compute and all-reduce (back to back, nothing else timed between them)
    parts = out["wait_s"] + out["compute_s"] + out["sync_s"]
    assert parts <= out["step_s"] <= parts + 1e-3


def test_a_calibration_it_cannot_run_is_named():
    with pytest.raises(CaramelError, match="loader workers >= 1"):
        loaded_steps([(torch.zeros(1),)], 1, loader_workers=0, prefetch_factor=2, steps=10, compute_s=0.0,
                     sync=lambda: None)
    with pytest.raises(CaramelError, match=f"more than {WARMUP_STEPS} steps"):
        loaded_steps([(torch.zeros(1),)], 1, loader_workers=1, prefetch_factor=2, steps=WARMUP_STEPS, compute_s=0.0,
                     sync=lambda: None)


def test_each_round_is_scored_against_the_runs_floor_of_steps_alone():
    # round 2's window of steps alone ran slow (interference), the loaded steps after it slower still; trip 1 ms
    cals = [{"alone_s": 4e-3, "loaded": {"step_s": 6e-3}}, {"alone_s": 6e-3, "loaded": {"step_s": 9.1e-3}},
            {"alone_s": 4.9e-3, "loaded": {"step_s": 5.5e-3}}]
    assert alone_floor_s(4.5e-3, cals) == 4e-3  # the quickest window, the one before the modes included
    assert alone_floor_s(3e-3, cals) == 3e-3 and alone_floor_s(None, []) is None
    rounds = round_inputs(cals, 1e-3, 4e-3)
    assert [a for _, a in rounds] == [4e-3] * 3
    assert [c for c, _ in rounds] == pytest.approx([1.2, 1.82, 1.1])  # each round's loaded step, its own load
    # a loaded step quicker than the floor plus the trip is noise, not a speedup
    assert round_inputs([{"alone_s": 4e-3, "loaded": {"step_s": 4.5e-3}}], 1e-3, 4e-3) == [(1.0, 4e-3)]
    assert round_inputs([], 1e-3, 4e-3) == []  # not calibrated: no round of its own
    assert round_inputs([{"alone_s": 4e-3, "loaded": None}], 1e-3, 4e-3) == [(1.0, 4e-3)]  # no workers: alone only


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    write_dataset(root, ((torch.full((32,), float(i)), torch.tensor(i)) for i in range(48)), samples_per_shard=8)
    return root


def test_the_calibration_order_reads_the_first_shards_in_shuffled_passes(store):
    index = Store(str(store)).index()
    shards = calibration_shards(str(store), index)
    assert [info.name for info, _ in shards] == [s.name for s in index.shards[:2]]
    order = calibration_order(shards, index, 40, seed=3)
    assert len(order) == 40 and order == calibration_order(shards, index, 40, seed=3)  # seeded
    for p in range(0, 32, 16):  # each full pass is every sample of the two shards once, shuffled
        assert sorted(order[p:p + 16]) == list(range(16))
    assert order[:16] != list(range(16)) and order != calibration_order(shards, index, 40, seed=4)


def _cfg(**kw):
    return SimpleNamespace(**dict(dict(batch_size=4, loader_workers=1, prefetch_factor=2,
                                       calibration_steps=WARMUP_STEPS + 3, ranks=2, seed=0), **kw))


@pytest.mark.timeout(60)
def test_a_modes_calibration_runs_its_own_loader_without_reading_the_store(store, tmp_path):
    index = Store(str(store)).index()
    shards = calibration_shards(str(store), index)
    cfg = _cfg()
    counters = TierCounters()
    with serve_directory(store) as server:
        loader = mode_calibration_loader("locality", cfg, server.url, index, 1, shards, str(tmp_path / "cal"),
                                         (0, 1 << 20), counters)
        assert type(loader) is _stateful_loader_class()  # the class make_loader gives the cached and locality modes
        out = steady_steps(loader, cfg.calibration_steps, 1e-3, lambda: None)
        served = server.bytes_served
    assert out["step_s"] >= out["compute_s"] >= 1e-3 and out["first_pass_step_s"] >= 1e-3
    snap = counters.snapshot()
    # every batch of both passes from the calibration's two shards, none from the store
    steps = 2 * cfg.calibration_steps
    assert snap.misses == 0 and snap.store_bytes == 0 and snap.memory_hits + snap.disk_hits >= 4 * steps
    # each shard read from disk once, then from the worker's memory tier: the worker persisted into the second pass
    assert snap.disk_reads <= 2
    assert served == 0  # not even the index: the caller's (a cluster's server counts only the modes' reads)
    plain = mode_calibration_loader("remote", cfg, server.url, index, 0, shards, str(tmp_path / "plain"), (0, 0), counters)
    assert type(plain) is torch.utils.data.DataLoader and plain.persistent_workers
    batch = next(iter(plain))
    assert batch[0].shape == (4, 32) and batch[1].tolist() == list(range(4))  # in memory, default collate


def test_a_modes_step_is_the_median_of_its_rounds_predictions(store):
    from caramel.bench.data_bench import DataBenchConfig, ModeResult
    from caramel.bench.data_report import summarize

    index = Store(str(store)).index()
    cfg = DataBenchConfig(ranks=2, batch_size=4, loader_workers=2, epochs=2, rounds=3, compute_s=4e-3,
                          modes=("locality",))
    # a full cache: nothing remote, every sample from memory; 6 steps per epoch of 7 ms
    tiers = {"memory_hits": 48, "disk_hits": 0, "misses": 0, "store_requests": 0, "store_bytes": 0, "disk_reads": 0}
    loads = [(6.0e-3, 4.5e-3), (9.0e-3, 7.0e-3), (7.4e-3, 4.4e-3)]  # (beside the loader, alone) per round
    r = ModeResult("locality", epoch_step_s=[[7e-3] * 6] * 6, epoch_wait_s=[1e-3] * 6, epoch_sync_s=[1e-3] * 6,
                   epoch_tiers=[tiers] * 6, epoch_remote_bytes=[0] * 6, epoch_requests=[0] * 6,
                   calibrations=[{"mode": "locality", "round": k, "alone_s": a, "loaded": {"step_s": s}}
                                 for k, (s, a) in enumerate(loads)])
    costs = {"local_s_per_sample": 1e-5, "disk_s_per_read": 2e-4, "batch_s_pipe": 3e-4, "batch_s_shared": 1e-3,
             "request_overhead_s": 5e-4, "compute_comm_s": 4.5e-3, "loaded": {"step_s": 5.4e-3}}
    report = summarize(cfg, {"locality": r}, index, costs, (1 << 20, 1 << 20), "test", True)
    (row,) = report["rows"]
    assert report["format"] == "caramel.data-bench/7"  # the per-round model: not the /2 records' meaning
    assert row["epoch_step_s"] == [[7e-3] * 6] * 6  # rank 0's every step, epoch by epoch, kept in the record
    assert row["wait_s_steady_ranks"] is None and row["sync_s_steady_ranks"] is None  # no rank's kept here
    # with nothing to load each round's step is its compute side, max(alone + trip, beside the loader),
    # and each epoch's first batch waits for a worker's whole batch: 2 workers x the data period, over
    # the epoch's 6 steps (48 samples / 2 ranks / 4)
    assert index.num_samples == 48
    edge = 2 * row["predicted_data_s"] / 6
    assert row["predicted_data_s"] < 1e-3
    assert row["predicted_step_s_rounds"] == pytest.approx([6.0e-3 + edge, 9.0e-3 + edge, 7.4e-3 + edge], rel=1e-3)
    # ...and the mode's is their median, as the measured step is the median of its epochs
    assert row["predicted_step_s"] == pytest.approx(7.4e-3 + edge, rel=1e-3)
    assert row["prediction_error"] == pytest.approx((7.4e-3 + edge) / 7e-3 - 1, rel=1e-2)
    # the one calibration before the modes: 5.4 / (4.5 + 0.3) = x1.125 on its 4.5 + 0.3 ms
    assert row["predicted_step_s_one_calibration"] == pytest.approx(5.4e-3 + edge, rel=1e-3)
    # the median round's calibration timed a warm loader's restart 5 ms over its steady steps: its epoch
    # edge gains that start less the 2 batches from memory it charges already, over the 6 steps
    restarted = dict(r.calibrations[2], loaded={"step_s": 7.4e-3,
                                                "restart_step_s": [12.4e-3] + [7.4e-3] * (WARMUP_STEPS - 1)})
    r2 = replace(r, calibrations=[r.calibrations[0], r.calibrations[1], restarted])
    report2 = summarize(cfg, {"locality": r2}, index, costs, (1 << 20, 1 << 20), "test", True)
    (row2,) = report2["rows"]
    moved = (5e-3 - 2 * row["predicted_data_s"]) / 6
    assert moved > 0.5e-3
    assert row2["predicted_step_s_rounds"] == pytest.approx(
        [6.0e-3 + edge, 9.0e-3 + edge, 7.4e-3 + edge + moved], rel=1e-3)
    assert row2["predicted_step_s"] == pytest.approx(7.4e-3 + edge + moved, rel=1e-3)  # still the median round
    assert row2["predicted_step_s_overhead_alone"] == pytest.approx(row2["predicted_step_s"], rel=1e-9)
    assert row2["epoch_start_s_rounds"] == pytest.approx([0.0, 0.0, 5e-3]) and row["epoch_start_s_rounds"] == [0.0] * 3
    # the table shows the restart a round timed (the value --data-epoch-start takes), "-" where none did
    from caramel.bench.data_report import format_rows

    for rep, shown in ((report, "-"), (report2, "5.0")):
        head, _, line = format_rows(rep, markdown=True).splitlines()
        assert line.split(" | ")[head.split(" | ").index("restart ms")] == shown


@pytest.mark.timeout(60)
def test_a_calibration_leaves_no_worker_and_no_cache_even_on_an_error(store, tmp_path):
    import multiprocessing

    from caramel.bench.data_bench import DataBenchConfig
    from caramel.bench.data_bench_rank import _mode_calibration

    index = Store(str(store)).index()
    shards = calibration_shards(str(store), index)
    cfg = DataBenchConfig(ranks=2, batch_size=4, loader_workers=1, calibration_steps=WARMUP_STEPS + 3, compute_s=0.0)
    cache = tmp_path / "calibration-0-locality" / "rank1"
    calls = []

    def sync(fail_at=None):
        calls.append(1)
        if cache.exists():
            seen.add(len(calls))
        if len(calls) == fail_at:
            raise RuntimeError("a peer went away")

    seen: set[int] = set()
    out = _mode_calibration("locality", cfg, str(store), index, 1, 0, str(tmp_path), (0, 1 << 20), shards,
                            TierCounters(), sync)
    assert out["loaded"]["step_s"] > 0 and seen  # the cache was there while the steps ran...
    assert not cache.exists() and multiprocessing.active_children() == []  # ...and is gone with the workers
    calls.clear()
    fail_at = cfg.calibration_steps + 4  # alone, then into the loaded steps' first pass
    with pytest.raises(RuntimeError, match="a peer went away") as err:
        _mode_calibration("locality", cfg, str(store), index, 1, 0, str(tmp_path), (0, 1 << 20), shards,
                          TierCounters(), lambda: sync(fail_at))
    # the traceback (still held here) holds the loader's frames; its workers stopped all the same
    assert err.value is not None and multiprocessing.active_children() == []
    assert not cache.exists()
