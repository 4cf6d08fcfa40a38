"""The data bench's calibration window: steps or seconds, summed up by the mean or by the median
of sub-windows; bad values are one error naming what is expected."""
import argparse

import pytest

from caramel.bench.calibration_window import (MAX_STEPS, WARMUP_STEPS, CalibrationWindow, parse_calibration_window,
                                              window_summary)
from caramel.bench.data_bench import DataBenchConfig, run_data_bench
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
    assert CalibrationWindow(seconds=1.0).steps_for(1.0 / (MAX_STEPS - WARMUP_STEPS)) == MAX_STEPS
    with pytest.raises(CaramelError, match=f"needs {MAX_STEPS + 1} steps, more than {MAX_STEPS}"):  # not clamped
        CalibrationWindow(seconds=1.0).steps_for(1.0 / (MAX_STEPS - WARMUP_STEPS + 1))
    assert CalibrationWindow(seconds=0.01).steps_for(0.003) == 4 + WARMUP_STEPS  # 3.3 steps: rounded up


def test_a_window_that_cannot_end_before_the_timeout_is_refused_before_running():
    CalibrationWindow(steps=1000).check_time(0.004, 600.0)
    with pytest.raises(CaramelError, match="1000 steps of at least 0.2 s: .* not under the timeout of 600 s"):
        CalibrationWindow(steps=1000).check_time(0.2, 600.0)
    with pytest.raises(CaramelError, match="window of 30 s: its 3 windows per round last at least 90 s"):
        CalibrationWindow(seconds=30.0).check_time(0.004, 60.0)
    for cfg, why in [(DataBenchConfig(calibration_sub_windows=0), "sub-windows 0: expected an integer >= 1"),
                     (DataBenchConfig(calibration_seconds=1.0, calibration_steps=2), "first window of 2 steps"),
                     (DataBenchConfig(calibration_steps=200_000), "expected 3 to 100000 steps"),
                     (DataBenchConfig(calibration_steps=10_000, compute_s=0.1), "not under the timeout of 600 s")]:
        with pytest.raises(CaramelError, match=why):
            run_data_bench(cfg)  # the bench's own guard, apart from the command line's


@pytest.mark.parametrize("kwargs, why", [
    (dict(steps=2, seconds=1.0), "first window of 2 steps alone: expected 3 to"),
    (dict(steps=0, seconds=1.0), "first window of 0 steps alone: expected 3 to"),
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
                                       ("0ms", "a duration > 0"), ("-1s", "a duration > 0"),
                                       ("fast", "or a whole number of steps"), ("2min", "or a whole number of steps"),
                                       ("\u00b2", "whole number of steps"), ("\u0663", "whole number of steps")])
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
    with pytest.raises(CaramelError, match="--calibration-window 100000 with --compute 4ms: .* timeout of 600 s"):
        config_from(_args("--calibration-window", "100000"), 2, 8, 3, None)


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


def test_the_restart_pass_is_summed_up_by_its_sub_windows(monkeypatch):
    import caramel.bench.data_contention as contention

    clock = _Clock()
    monkeypatch.setattr(contention, "time", clock)
    fetch_s = [0.001] * (WARMUP_STEPS + 6) + [0.03] * 3  # the last of 3 sub-windows of 9 steps: slow batches

    class Loader:
        def __iter__(self):
            for s in fetch_s:
                clock.now += s
                yield 0
    out = steady_steps(Loader(), WARMUP_STEPS + 9, 0.0, lambda: None, sub_windows=3)
    assert len(out["steps_s"]) == 9 and len(out["restart_step_s"]) == WARMUP_STEPS and "first_pass_step_s" in out
    assert out["step_s_mean"] == pytest.approx((6 * 0.001 + 3 * 0.03) / 9)
    assert out["step_s"] == pytest.approx(0.001) == window_summary(out["steps_s"], 3)  # not the mean


def _seconds_window_rank(rank: int, world: int) -> dict:
    """A rank of a 2-rank run with a window in seconds: its own first window of steps alone (rank 1
    twice as slow), then one mode's calibration beside a loader whose last sub-window is slow."""
    import functools

    import torch
    import torch.distributed as dist

    import caramel.bench.data_bench_rank as rank_side
    import caramel.bench.data_contention as contention
    from caramel.data.tiers import TierCounters

    class BurstLoader:
        """Each pass: the warm-up, then `steps` batches whose last third comes 50 ms late."""

        def __init__(self, steps: int) -> None:
            self.steps = steps

        def __iter__(self):
            import time

            for i in range(self.steps + 1):
                if i >= WARMUP_STEPS + round(2 * (self.steps - WARMUP_STEPS) / 3):
                    time.sleep(0.05)  # far above a loaded host's step, so the burst decides the mean
                yield i

    rank_side._steps_alone = lambda cfg, sync: (0.01, 0.02)[rank]
    contention.mode_calibration_loader = lambda mode, cfg, *_: BurstLoader(cfg.calibration_steps)
    sync = functools.partial(dist.all_reduce, torch.zeros(1))
    cfg = DataBenchConfig(ranks=2, loader_workers=1, compute_s=0.0, calibration_seconds=0.1,
                          calibration_sub_windows=3)
    sent: list = []
    cfg = rank_side._first_windows(cfg, rank, type("Q", (), {"put": staticmethod(sent.append)}), None, sync)
    counts = [None, None]
    dist.all_gather_object(counts, cfg.calibration_steps)
    if counts[0] != counts[1]:  # the ranks would wait on each other's steps: stop here, both of them
        return {"counts": counts}
    out = rank_side._mode_calibration("locality", cfg, "", None, rank, 0, "/nonexistent", (0, 0), [None],
                                      TierCounters(), sync)
    loaded = out["loaded"]
    return {"counts": counts, "sent": sent, "window_steps": out.get("window_steps"),
            "sub_windows": loaded.get("sub_windows"), "steps_s": loaded["steps_s"], "step_s": loaded["step_s"],
            "step_s_mean": loaded["step_s_mean"]}


@pytest.mark.timeout(150)  # generous: a timed bench elsewhere on the host starves the ranks, never hangs them
def test_a_window_in_seconds_becomes_one_step_count_from_the_slowest_ranks_steps():
    """Two gloo ranks: the slowest rank's first steps alone (the maximum, not the sum or a rank's
    own) give every rank one count, which each round's calibration runs and records, summed up by
    the median of its sub-windows."""
    from caramel.testing import run_workers

    window = CalibrationWindow(seconds=0.1, sub_windows=3)
    expected = window.steps_for(0.02)
    assert len({expected, window.steps_for(0.01), window.steps_for(0.03)}) == 3  # each mistake shows
    for rank, res in enumerate(run_workers(_seconds_window_rank, 2, timeout_s=120, collective_timeout_s=30)):
        assert res["counts"] == [expected, expected], res
        assert res["sent"] == ([("alone", 0.01)] if rank == 0 else [])
        assert res["window_steps"] == expected and res["sub_windows"] == 3
        assert len(res["steps_s"]) == expected - WARMUP_STEPS
        assert res["step_s"] == window_summary(res["steps_s"], 3) < res["step_s_mean"]  # the burst left out
