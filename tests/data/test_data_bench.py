"""The data bench end to end, small: two gloo ranks, a throttled server, remote reads vs the
locality-aware sampler; the server's byte counts say what each mode fetched."""
import pytest

from caramel.bench.data_bench import DataBenchConfig, run_data_bench


@pytest.mark.timeout(120)
def test_locality_reads_nothing_remote_after_the_first_epoch():
    cfg = DataBenchConfig(ranks=2, samples=64, sample_bytes=2048, samples_per_shard=8, batch_size=4, loader_workers=0,
                          epochs=2, rounds=1, compute_s=0.0, store_rate_bps=200e6, store_latency_s=0.0,
                          cache_share=1.0, modes=("remote", "locality"), timeout_s=60)
    report = run_data_bench(cfg)
    rows = {r["mode"]: r for r in report["rows"]}
    data = report["encoded_sample_bytes"] * 64
    # remote: every sample of the epoch by a range read, every epoch
    assert rows["remote"]["remote_bytes_per_epoch_steady"] == data
    assert rows["remote"]["requests_per_epoch_steady"] == 64
    # locality: epoch 1 fetches each rank's home shards once (the index reads fall in it too), epoch 2 nothing
    assert rows["locality"]["remote_bytes_per_epoch_first"] >= data
    assert rows["locality"]["remote_bytes_per_epoch_steady"] == 0 and rows["locality"]["hit_rate_steady"] == 1.0


def test_bad_input_is_named(capsys):
    from caramel.cli import main

    assert main(["data-bench", "--modes", "remote,fast"]) == 2
    assert "'fast' is not a mode" in capsys.readouterr().err
    assert main(["data-bench", "--epochs", "1"]) == 2
    assert "--epochs >= 2" in capsys.readouterr().err
