"""Bad input to the data-loading bench's commands: every option is either used or refused with
one error naming it; nothing is silently ignored or replaced by a default."""
import pytest

from caramel.cli import main
from caramel.errors import CaramelError
from caramel.units import parse_duration_arg_s


@pytest.fixture()
def store_dir(tmp_path):
    from caramel.data.format import write_random_dataset

    write_random_dataset(tmp_path, 8, 64, 4)
    return tmp_path


@pytest.mark.parametrize("flags, named", [
    (["--strategies", "ddp"], "--strategies"), (["--model", "resnet18"], "--model"), (["--ratio", "1"], "--ratio"),
    (["--bandwidth", "100mbit"], "--bandwidth"), (["--steps", "5"], "--steps"), (["--quick"], "--quick"),
    (["--mtu", "9000"], "--mtu"), (["--model-option", "width=8"], "--model-option"),
])
def test_strategy_flags_with_data_are_refused(store_dir, capsys, flags, named):
    assert main(["bench", "--data", str(store_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert f"{named} has no meaning with --data" in err and "data-loading bench" in err


@pytest.mark.parametrize("flags", [["--data-epochs", "5"], ["--cache-share", "0.5"], ["--compute", "8ms"],
                                   ["--store-rate", "50mbit"], ["--data-modes", "remote"]])
def test_data_flags_without_data_are_refused(capsys, flags):
    assert main(["bench", "--model", "small_cnn", *flags]) == 2
    assert f"{flags[0]} is a data-loading option: it needs --data URL" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--workers", "--rounds", "--batch-size"])
def test_zero_is_refused_not_taken_for_the_default(store_dir, capsys, flag):
    assert main(["bench", "--data", str(store_dir), flag, "0"]) == 2
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_data_bench_names_the_flag_out_of_range(capsys):
    assert main(["data-bench", "--ranks", "0"]) == 2
    assert "--ranks must be >= 1, got 0" in capsys.readouterr().err
    assert main(["data-bench", "--epochs", "1"]) == 2
    assert "--epochs must be >= 2 (the first is cold), got 1" in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [("0", 0.0), ("0ms", 0.0), ("2ms", 0.002), ("1.5s", 1.5), ("50us", 50e-6),
                                           ("3 s", 3.0), ("+2ms", 0.002), ("+0us", 0.0)])
def test_durations_parse_a_number_with_its_unit(text, seconds):
    assert parse_duration_arg_s(text, "--compute") == pytest.approx(seconds)


@pytest.mark.parametrize("text, why", [("ms", "is not understood"), ("", "is not understood"),
                                       ("-1ms", "is negative"), ("1e-400ms", "out of range"), ("fast", "is not understood"),
                                       ("1e999", "has no unit"), ("1.5", "has no unit"), ("2min", "in s, ms, us")])
def test_a_duration_without_a_number_or_unit_is_refused(text, why):
    with pytest.raises(CaramelError, match=why) as info:
        parse_duration_arg_s(text, "--compute")
    assert str(info.value).startswith(f"--compute {text!r}")


@pytest.mark.parametrize("argv, flag, text", [
    (["bench", "--data", "{dir}", "--compute", "4"], "--compute", "4"),
    (["bench", "--data", "{dir}", "--store-latency", "0.002"], "--store-latency", "0.002"),
    (["bench", "--data", "http://203.0.113.5:8000", "--store-latency", "0.002"], "--store-latency", "0.002"),
    (["data-bench", "--compute", "1.5"], "--compute", "1.5"),
    (["data", "serve", "{dir}", "--port", "0", "--latency", "2", "--seconds", "1"], "--latency", "2"),
])
def test_a_bare_time_is_refused_not_read_as_seconds(store_dir, capsys, argv, flag, text):
    assert main([a.format(dir=store_dir) for a in argv]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {text!r} has no unit; expected a duration >= 0 with its unit (s, ms, us)" in err


@pytest.mark.parametrize("latency", ["2ms", "0ms"])
def test_a_store_latency_for_a_store_at_a_url_is_refused_not_ignored(capsys, latency):
    # the delay is the served directory's emulated link; a remote store's is its own (nothing is contacted)
    assert main(["bench", "--data", "http://203.0.113.5:8000", "--store-latency", latency]) == 2
    assert (f"--store-latency {latency!r} applies to a served directory (its emulated link); the store at "
            "http://203.0.113.5:8000 is not one") in capsys.readouterr().err


@pytest.mark.parametrize("seconds", ["-1", "0", "nan"])
def test_data_serve_refuses_a_non_positive_time(store_dir, capsys, seconds):
    assert main(["data", "serve", str(store_dir), "--port", "0", "--seconds", seconds]) == 2
    assert "--seconds must be a positive number of seconds" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_batch_size_above_a_ranks_share_is_refused_before_the_ranks_start(store_dir, capsys):
    # 8 samples over 2 ranks: 4 each, so a batch of 5 would leave every rank without a step
    assert main(["bench", "--data", str(store_dir), "--workers", "2", "--batch-size", "5"]) == 2
    assert "--batch-size 5: each of the 2 ranks gets 4 of the 8 samples" in capsys.readouterr().err
    assert main(["data-bench", "--samples", "8", "--ranks", "2", "--batch-size", "5"]) == 2
    assert "--batch-size 5: each of the 2 ranks gets 4 of the 8 samples" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--workload", "digits", "--samples", "64"], "--samples 64: not used for --workload digits"),
    (["--workload", "char_gpt", "--sample-bytes", "1kb", "--seed", "3"],
     "--sample-bytes 1kb, --seed 3: not used for --workload char_gpt"),
    (["--workload", "digits", "--seq-len", "32"], "--seq-len 32: not used for --workload digits"),
    (["--val-fraction", "0.2"], "--val-fraction 0.2: not used for a random set (no --workload)"),
    (["--text-bytes", "5000", "--seq-len", "8"], "--seq-len 8, --text-bytes 5000: not used for a random set"),
])
def test_data_make_refuses_options_its_set_does_not_use(tmp_path, capsys, flags, named):
    assert main(["data", "make", str(tmp_path / "ds"), *flags]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_data_make_takes_the_options_its_set_uses(tmp_path, capsys):
    assert main(["data", "make", str(tmp_path / "r"), "--samples", "8", "--sample-bytes", "64", "--seed", "1"]) == 0
    assert "8 samples" in capsys.readouterr().out
    assert main(["data", "make", str(tmp_path / "d"), "--workload", "digits", "--val-fraction", "0.05"]) == 0
    assert "1707 samples" in capsys.readouterr().out
