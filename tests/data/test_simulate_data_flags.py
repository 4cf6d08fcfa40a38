"""`caramel simulate`'s --data-* flags: one unit rule for their times, any zero, no flag ignored
without --data-sample-bytes, and the read under load kept off shard fetches (as the bench)."""
import json

import pytest

from caramel.cli import main
from caramel.units import parse_duration_arg_s
from caramel.data.io_model import DataLoadModel
from caramel.errors import CaramelError

SIM = ["simulate", "--synthetic", "chain4", "--workers", "2", "--planner", "fifo", "--iterations", "1"]
DATA = ["--data-sample-bytes", "16kb", "--data-batch", "8"]
TIMES = ("--data-latency", "--data-local-per-sample", "--data-disk-per-read", "--data-batch-overhead",
         "--data-read-under-load")


def test_the_data_times_need_a_unit_and_take_any_zero_in_their_units():
    for flag in TIMES:
        assert parse_duration_arg_s("1.2ms", flag) == pytest.approx(1.2e-3)
        assert parse_duration_arg_s("800us", flag) == pytest.approx(800e-6)
        assert parse_duration_arg_s("+800us", flag) == pytest.approx(800e-6)  # as +0us is 0
        for zero in ("0", "0.0", "0.0ms", "-0", "+0us", "0e3", ".0s"):
            assert parse_duration_arg_s(zero, flag) == 0.0, zero
        for bad, why in (("2", "has no unit"), ("1.2", "has no unit"), ("1e-3", "has no unit"),
                         ("1.2m", "in s, ms, us"), ("1min", "in s, ms, us"), ("1h", "in s, ms, us"),
                         ("0m", "in s, ms, us"), ("0min", "in s, ms, us"), ("0.0h", "in s, ms, us"),
                         ("-1ms", "expected a duration >= 0"), ("-2", "has no unit"), ("nan", "not understood"),
                         ("1e999ms", "out of range"),
                         ("1e-400ms", "out of range"), ("ms", "not understood"), ("1.2parsecs", "in s, ms, us")):
            with pytest.raises(CaramelError, match=why) as info:
                parse_duration_arg_s(bad, flag)
            assert str(info.value).startswith(f"{flag} {bad!r}"), str(info.value)


def test_simulate_applies_the_rule_to_every_data_time(capsys, tmp_path):
    for flag in TIMES:
        assert main(SIM + DATA + [flag, "2"]) == 2
        err = capsys.readouterr().err
        assert f"{flag} '2' has no unit" in err
        assert main(SIM + DATA + [flag, "1.2m"]) == 2
        assert f"{flag} '1.2m'" in capsys.readouterr().err

    def data_time_s(*extra):
        out = tmp_path / "sim.json"
        assert main(SIM + DATA + list(extra) + ["--json", str(out)]) == 0
        return json.loads(out.read_text())["records"][0]["data_time_s"]

    zero = data_time_s("--data-latency", "0")
    assert zero == data_time_s("--data-latency", "0.0ms") == data_time_s("--data-latency", "-0")
    assert zero < data_time_s()  # the default 1 ms


def test_a_data_flag_without_the_model_is_an_error(capsys):
    assert main(SIM + ["--data-read-under-load", "1.2"]) == 2  # checked as when the model is on
    assert "--data-read-under-load '1.2' has no unit" in capsys.readouterr().err
    for extra in (["--data-read-under-load", "1.2ms"], ["--data-latency", "1ms"], ["--data-batch", "32"],
                  ["--data-hit-rate", "0"], ["--data-misses-last"]):
        assert main(SIM + extra) == 2
        assert f"{extra[0]} needs --data-sample-bytes" in capsys.readouterr().err
    assert main(SIM) == 0


def test_shard_fetches_are_not_charged_the_read_under_load(capsys):
    shards = ["--data-request-bytes", "256kb"]
    assert main(SIM + DATA + shards + ["--data-read-under-load", "5ms"]) == 2
    err = capsys.readouterr().err
    assert "--data-read-under-load" in err and "--data-request-bytes" in err
    assert main(SIM + DATA + shards + ["--data-read-under-load", "0ms"]) == 0
    m = DataLoadModel(sample_bytes=16e3, batch_size=8, ranks=2, store_bandwidth_bps=1e8, store_latency_s=1e-3,
                      hit_rate=0.0, request_bytes=256e3)
    with pytest.raises(CaramelError, match="worker_request_s"):
        DataLoadModel(**{**m.__dict__, "worker_request_s": 1e-3})


def test_simulate_charges_the_epoch_edge_when_given_the_epoch_steps(capsys, tmp_path):
    out = tmp_path / "sim.json"

    def data_step(*extra):
        assert main(SIM + DATA + ["--data-bandwidth", "100mbit", "--data-latency", "2ms", *extra,
                                  "--json", str(out)]) == 0
        return json.loads(out.read_text())["records"][0]

    plain, edged = data_step(), data_step("--data-epoch-steps", "32")
    assert plain["data"]["epoch_steps"] is None and edged["data"]["epoch_steps"] == 32
    # compute-bound (90 ms against 2 ranks x 8 x 16 kB over 100 Mbit/s, 20.5 ms): each epoch's first batch
    # waits for a worker's whole batch, 2 workers x the data period, once in 32 steps
    assert plain["step_time_with_data_s"] == plain["step_time_s"] > plain["data_time_s"]
    assert edged["step_time_with_data_s"] - plain["step_time_with_data_s"] == pytest.approx(2 * plain["data_time_s"] / 32)
    for bad in ("0", "-3"):
        assert main(SIM + DATA + ["--data-epoch-steps", bad]) == 2
        assert "--data-epoch-steps" in capsys.readouterr().err
    assert main(SIM + DATA + ["--data-loader-workers", "0", "--data-epoch-steps", "32"]) == 2
    assert "--data-epoch-steps needs loader workers (--data-loader-workers >= 1)" in capsys.readouterr().err
    assert main(SIM + DATA + ["--data-epoch-steps", "32"]) == 0
    assert "loader workers: " in (out := capsys.readouterr().out) and "epoch edge over 32 steps" in out
    assert main(SIM + ["--data-epoch-steps", "32"]) == 2
    assert "--data-epoch-steps needs --data-sample-bytes" in capsys.readouterr().err
    # a measured restart of the warm workers (nothing local to load here: all of it is beyond the
    # batches from memory) joins the edge once per epoch; alone, with no epoch to charge it to, refused
    out = tmp_path / "sim.json"  # the name the printed output took above
    started = data_step("--data-epoch-steps", "32", "--data-epoch-start", "5ms")
    assert started["data"]["epoch_start_s"] == 5e-3
    assert started["step_time_with_data_s"] - edged["step_time_with_data_s"] == pytest.approx(5e-3 / 32)
    assert main(SIM + DATA + ["--data-epoch-start", "5ms"]) == 2
    assert "--data-epoch-start is charged once per epoch: it needs --data-epoch-steps" in capsys.readouterr().err
    assert main(SIM + DATA + ["--data-epoch-steps", "32", "--data-epoch-start", "5"]) == 2  # a bare number: no unit
    err = capsys.readouterr().err
    assert "--data-epoch-start '5' has no unit" in err
