"""The data bench's calibration window: steps or seconds, summed up by the mean or by the median
of sub-windows; bad values are one error naming what is expected."""
import argparse

import pytest

from caramel.bench.calibration_window import (WARMUP_STEPS, CalibrationWindow, parse_calibration_window,
                                              window_summary)
from caramel.bench.data_cli import add_loading_arguments, config_from
from caramel.bench.data_contention import steady_steps, time_steps
from caramel.cli import main
from caramel.errors import CaramelError


def test_the_mean_is_one_sub_window_and_a_burst_leaves_the_median_of_sub_windows():
    steps = [1.0] * 30 + [10.0] * 10  # a burst of slow steps in the last quarter
    assert window_summary(steps) == pytest.approx(3.25)
    assert window_summary(steps, 4) == pytest.approx(1.0)  # parts' means 1, 1, 1, 10
    assert window_summary([1.0, 2.0, 3.0, 4.0, 5.0], 2) == pytest.approx((1.5 + 4.0) / 2)  # parts of 2 and 3 steps
    assert window_summary([4.0, 1.0, 9.0], 3) == pytest.approx(4.0)  # one step a part: the median step
    with pytest.raises(CaramelError, match="3 steps cannot be cut into 4"):
        window_summary([1.0, 2.0, 3.0], 4)


def test_a_window_in_seconds_is_the_steps_alone_that_last_it_plus_the_warm_up():
    assert CalibrationWindow(steps=40).steps_for(0.004) == 40  # in steps: as given
    assert CalibrationWindow(seconds=1.0).steps_for(0.004) == 250 + WARMUP_STEPS
    assert CalibrationWindow(seconds=0.01, sub_windows=8).steps_for(0.004) == 8 + WARMUP_STEPS  # one step a part at least
    with pytest.raises(CaramelError, match="gives no step count"):
        CalibrationWindow(seconds=1.0).steps_for(0.0)


@pytest.mark.parametrize("kwargs, why", [
    (dict(steps=2), "expected 3 to 100000 steps"), (dict(steps=0), "expected 3 to"),
    (dict(steps=5, sub_windows=4), "expected 6 to 100000 steps"), (dict(steps=40.0), "whole number of steps"),
    (dict(steps=True), "whole number of steps"), (dict(sub_windows=0), "sub-windows 0: expected an integer >= 1"),
    (dict(sub_windows=True), "expected an integer >= 1"), (dict(seconds=0.0), "a duration > 0"),
    (dict(seconds=-1.0), "a duration > 0"), (dict(seconds=float("inf")), "a duration > 0"),
    (dict(seconds=61.0), "at most 60 s"),
])
def test_a_bad_window_is_one_error_saying_what_is_expected(kwargs, why):
    with pytest.raises(CaramelError, match=why):
        CalibrationWindow(**kwargs)


@pytest.mark.parametrize("text, parsed", [("160", (160, None)), ("1.5s", (None, 1.5)), ("800ms", (None, 0.8))])
def test_the_flag_reads_steps_or_a_duration_with_its_unit(text, parsed):
    steps, seconds = parse_calibration_window(text)
    assert steps == parsed[0] and seconds == pytest.approx(parsed[1])


@pytest.mark.parametrize("text, why", [("1.5", "a whole number of steps"), ("-3", "a whole number of steps"),
                                       ("0ms", "a duration > 0"), ("fast", "or a whole number of steps"),
                                       ("2min", "or a whole number of steps")])
def test_the_flag_refuses_what_is_neither(text, why):
    with pytest.raises(CaramelError, match=why) as info:
        parse_calibration_window(text)
    assert "--calibration-window" in str(info.value)


def _args(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_loading_arguments(p)
    return p.parse_args(list(flags))


def test_the_options_reach_the_bench_config_and_default_to_the_old_window():
    cfg = config_from(_args(), 2, 8, 3, None)
    assert (cfg.calibration_steps, cfg.calibration_seconds, cfg.calibration_sub_windows) == (40, None, 1)
    cfg = config_from(_args("--calibration-window", "160", "--calibration-sub-windows", "4"), 2, 8, 3, None)
    assert (cfg.calibration_steps, cfg.calibration_seconds, cfg.calibration_sub_windows) == (160, None, 4)
    cfg = config_from(_args("--calibration-window", "1.5s"), 2, 8, 3, None)
    assert cfg.calibration_seconds == pytest.approx(1.5) and cfg.calibration_window().seconds == pytest.approx(1.5)
    with pytest.raises(CaramelError, match="--calibration-window 5 with --calibration-sub-windows 4"):
        config_from(_args("--calibration-window", "5", "--calibration-sub-windows", "4"), 2, 8, 3, None)


def test_the_commands_refuse_a_bad_window_before_running(capsys):
    assert main(["data-bench", "--calibration-sub-windows", "0"]) == 2
    assert "--calibration-sub-windows 0" in capsys.readouterr().err
    assert main(["bench", "--model", "small_cnn", "--calibration-window", "80"]) == 2
    assert "--calibration-window is a data-loading option" in capsys.readouterr().err


class _Clock:
    """A virtual clock for the timed steps: a fetch or a sleep advances it, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_timed_steps_keep_every_step_and_sum_them_up_by_sub_windows(monkeypatch):
    import caramel.bench.data_contention as contention

    clock = _Clock()
    monkeypatch.setattr(contention, "time", clock)
    waits = iter([0.001] * (WARMUP_STEPS + 12) + [0.05] * 4)  # a burst of slow batches in the last quarter

    def fetch():
        clock.now += next(waits)
        return 0
    out = time_steps(iter(fetch, None), WARMUP_STEPS + 16, 0.004, lambda: None, sub_windows=4)
    assert len(out["steps_s"]) == 16 and len(out["warmup_step_s"]) == WARMUP_STEPS
    assert out["step_s_mean"] == pytest.approx((12 * 0.005 + 4 * 0.054) / 16)  # the burst moves the mean...
    assert out["step_s"] == pytest.approx(0.005) == window_summary(out["steps_s"], 4)  # ...not the parts' median
    assert out["wait_s"] == pytest.approx((12 * 0.001 + 4 * 0.05) / 16)


def test_the_restart_pass_is_summed_up_by_its_sub_windows():
    class Loader:
        def __iter__(self):
            return iter(range(WARMUP_STEPS + 9))
    out = steady_steps(Loader(), WARMUP_STEPS + 8, 0.0, lambda: None, sub_windows=2)
    assert len(out["steps_s"]) == 8 and len(out["restart_step_s"]) == WARMUP_STEPS and "first_pass_step_s" in out
    assert out["step_s"] == pytest.approx(window_summary(out["steps_s"], 2))


@pytest.mark.timeout(60)
def test_a_window_in_seconds_becomes_one_step_count_from_the_slowest_ranks_steps(tmp_path):
    import datetime

    import torch.distributed as dist

    from caramel.bench.data_bench import DataBenchConfig
    from caramel.bench.data_bench_rank import _window_in_steps

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        cfg = DataBenchConfig(calibration_seconds=0.5, calibration_sub_windows=4)
        assert _window_in_steps(cfg, 0.005).calibration_steps == 100 + WARMUP_STEPS
        assert _window_in_steps(DataBenchConfig(calibration_steps=60), 0.005).calibration_steps == 60  # in steps: as given
    finally:
        dist.destroy_process_group()
