"""What the data bench measures belongs to the epoch it is reported for: the server's byte
counter is read before the ranks start an epoch, and a mode's loader workers are shut down
before the next mode's timing starts."""
import contextlib
import time
import weakref

import pytest
import torch

from caramel.bench import data_bench, data_bench_rank
from caramel.bench.data_bench import DataBenchConfig, run_data_bench
from caramel.data.serve import serve_directory
from caramel.data.tiers import TierCounters


class _SlowCounter:
    """The server, with a parent that takes its time reading the byte counter: any request the
    ranks made before the read would be missing from the epoch's bytes."""

    def __init__(self, server):
        self._server = server
        self.url = server.url

    @property
    def requests_served(self):
        return self._server.requests_served

    @property
    def bytes_served(self):
        time.sleep(0.2)
        return self._server.bytes_served


@pytest.mark.timeout(120)
def test_every_epoch_counts_all_its_bytes_however_late_the_parent_reads(monkeypatch):
    @contextlib.contextmanager
    def slow(*args, **kwargs):
        with serve_directory(*args, **kwargs) as server:
            yield _SlowCounter(server)

    monkeypatch.setattr(data_bench, "serve_directory", slow)
    cfg = DataBenchConfig(ranks=2, samples=32, sample_bytes=1024, samples_per_shard=8, batch_size=4, loader_workers=0,
                          epochs=2, rounds=1, compute_s=0.0, store_rate_bps=None, store_latency_s=0.0,
                          modes=("remote",), timeout_s=60, calibration_steps=2)
    report = run_data_bench(cfg)
    row = report["rows"][0]
    # the plain loader reads every sample by one range read every epoch, the first as the steady ones
    assert report["num_samples"] == 32 and report["data_bytes"] > 32 * 1024
    assert row["remote_bytes_per_epoch_first"] == row["remote_bytes_per_epoch_steady"] == report["data_bytes"]


class _Barrier:
    def wait(self):
        pass


class _Queue(list):
    put = list.append


@pytest.mark.timeout(60)
def test_a_modes_persistent_workers_end_with_its_loader_not_later():
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2,
                                         num_workers=1, persistent_workers=True, multiprocessing_context="fork")
    cfg = DataBenchConfig(epochs=2, compute_s=0.0)
    queue = _Queue()
    data_bench_rank._run_epochs(loader, None, cfg, 0, _Barrier(), queue, TierCounters(), lambda: None)
    assert [(kind, len(steps)) for kind, (_rank, _counts, steps, _wait, _sync) in queue] == [("epoch", 4)] * 2
    workers = loader._iterator._workers
    assert all(w.is_alive() for w in workers)  # persistent: kept between the mode's epochs
    gone = weakref.ref(loader._iterator)
    del loader  # what the rank does after the mode's epochs: nothing else holds the iterator
    assert gone() is None
    deadline = time.monotonic() + 10
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in workers)
