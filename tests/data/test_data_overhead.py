"""The data side's contention term: a range read timed under each round's calibration load,
charged to each read in its loader worker's sequence for that round."""
import time

import pytest

from caramel.bench.data_overhead import OverheadProbe, round_overheads
from caramel.data.format import write_random_dataset
from caramel.data.serve import serve_directory
from caramel.data.store import Store
from caramel.errors import CaramelError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("overhead-store")
    write_random_dataset(root, 32, 2048, 8)
    return root


def test_a_round_without_a_probe_keeps_the_overhead_alone():
    cals = [{"request_overhead_s": 2e-3}, {"request_overhead_s": None}, {"alone_s": 1e-3}]
    assert round_overheads(cals, 5e-4) == [2e-3, 5e-4, 5e-4]


@pytest.mark.timeout(30)
def test_the_probe_times_range_reads_until_it_exits(store):
    index = Store(str(store)).index()
    with serve_directory(store) as server:
        with OverheadProbe(server.url, index, pause_s=0.001) as probe:
            while probe.reads() < 5:
                time.sleep(0.005)
        served = server.requests_served
    assert probe.reads() >= 5 and served >= probe.reads()  # one request per read (and the index, none here)
    assert 0 < probe.overhead_s() < 1.0
    with pytest.raises(CaramelError, match="pause"):
        OverheadProbe(server.url, index, pause_s=-1)


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
                                  "request_overhead_s": o} for k, o in enumerate(under_load)])
    costs = {"local_s_per_sample": 0.0, "disk_s_per_read": 0.0, "batch_s_pipe": 0.0, "batch_s_shared": 0.0,
             "request_overhead_s": 5e-4, "compute_comm_s": 4e-3, "loaded": {"step_s": 4e-3}}
    report = summarize(cfg, {"remote": r}, index, costs, (0, 0), "test", True)
    (row,) = report["rows"]
    # the store's serial work: 2 ranks x 4 reads x 0.5 ms alone = 4 ms (the link moves 65 kB in 0.5 ms);
    # a worker's sequence: 4 reads x (1 ms latency + the read under load) / 2 workers; 4 reads in flight
    serial = 4e-3
    expected = [max(w, serial) + min(w, serial) / 4 for w in (4 * (1e-3 + o) / 2 for o in under_load)]
    assert row["predicted_step_s_rounds"] == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx([5e-3, 11e-3, 7e-3])
    assert row["predicted_step_s"] == pytest.approx(7e-3) and row["request_s_under_load"] == 2e-3
    assert row["prediction_error"] == pytest.approx(7 / 8 - 1)
    # without the term: the sequence is the latency alone, 2 ms, behind the store's 4 ms
    assert row["predicted_step_s_overhead_alone"] == pytest.approx(4e-3 + 2e-3 / 4)
