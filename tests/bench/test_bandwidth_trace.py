"""`--bandwidth-trace`: the file's parsing and checks, the controller's timing, and which
measured step lands in which phase (no cluster; one 2-rank gloo run of the measured rounds)."""
import math
import time

import pytest

from caramel.bench.bandwidth_trace import load_trace, parse_trace
from caramel.bench.baselines import Runner
from caramel.bench.phases import attribute, phase_results, phase_windows
from caramel.bench.trace_control import TraceController
from caramel.errors import CaramelError

pytestmark = pytest.mark.timeout(60)


def test_json_and_csv_traces_parse_and_relative_rates_scale_the_configuration_rate(tmp_path):
    js = parse_trace('[{"duration_s": 30, "rate": "x1"}, {"duration_s": 20.5, "rate": "x0.1"}]', "t.json")
    assert js.total_s == 50.5 and js.relative
    assert js.resolve(200e6) == [{"start_s": 0.0, "duration_s": 30.0, "rate_bps": 200e6, "rate": "x1"},
                                 {"start_s": 30.0, "duration_s": 20.5, "rate_bps": pytest.approx(20e6), "rate": "x0.1"}]
    f = tmp_path / "t.csv"
    f.write_text("# a 10x drop\nduration_s,rate\n30,1gbit\n\n30, 100mbit\n")
    csv = load_trace(f)
    assert not csv.relative and [p["rate_bps"] for p in csv.resolve(None)] == [1e9, 100e6]
    assert [p["start_s"] for p in csv.resolve(None)] == [0.0, 30.0]
    wrapped = parse_trace('{"phases": [{"duration_s": 5, "rate": "300mbit"}]}')
    assert wrapped.resolve(1e9)[0]["rate_bps"] == 300e6  # absolute rates ignore the base


@pytest.mark.parametrize("text, match", [
    ('[{"duration_s": 0, "rate": "x1"}]', r"phase 1: duration_s 0: expected a positive number of seconds"),
    ('[{"duration_s": 5, "rate": "x1"}, {"duration_s": "a", "rate": "x1"}]', r"phase 2: duration_s 'a'"),
    ('[{"duration_s": 5, "rate": "x-1"}]', r"phase 1: rate 'x-1': a relative rate is x and a positive factor"),
    ('[{"duration_s": 5, "rate": "fast"}]', r"phase 1: rate 'fast': .*e\.g\. x0\.1"),
    ('[{"duration_s": 5, "rate": 100}]', r"phase 1: rate 100: expected a tc rate"),
    ('[{"duration_s": 5, "bandwidth": "1gbit"}]', r"phase 1: expected \{\"duration_s\": SECONDS, \"rate\": RATE\}"),
    ('[]', r"no phases"),
    ('{"steps": []}', r"expected a list of phases or"),
    ('[{"duration_s": 5,', r"not valid JSON"),
    ("30,1gbit,extra\n", r"phase 1: expected two columns"),
    ("duration_s,rate\n", r"no phases"),
])
def test_bad_traces_get_one_clear_error_naming_the_file_and_phase(text, match):
    with pytest.raises(CaramelError, match=match) as e:
        parse_trace(text, "bad.json")
    assert str(e.value).startswith("bandwidth trace bad.json")


def test_relative_rates_need_a_base_and_a_missing_file_is_named(tmp_path):
    with pytest.raises(CaramelError, match=r"phase 2: rate x0\.1 is relative; give --ratio or --bandwidth"):
        parse_trace("30,1gbit\n30,x0.1\n", "t.csv").resolve(None)
    with pytest.raises(CaramelError, match=r"below tc's floor"):
        parse_trace("30,x0.00001\n", "t.csv").resolve(100e6)
    with pytest.raises(CaramelError, match=r"--bandwidth-trace .*nope\.json: cannot read it"):
        load_trace(tmp_path / "nope.json")


def test_windows_start_after_each_change_settles_and_end_where_the_next_begins():
    applied = [{"phase": 0, "rate_bps": 1e9, "began": 100.0, "ended": 100.0},
               {"phase": 1, "rate_bps": 1e8, "began": 130.0, "ended": 130.3}]
    assert phase_windows(applied, 3, settle_s=0.1) == [(100.0, 130.0), (pytest.approx(130.4), math.inf), None]
    # a change that failed: its phase and the ones after it are not attributed
    failed = applied[:1] + [{"phase": 1, "rate_bps": 1e8, "began": 130.0, "error": "tc failed"}]
    assert phase_windows(failed, 2) == [(100.0, 130.0), None]


def test_a_step_counts_for_a_phase_only_when_every_rank_ran_it_inside_the_window():
    windows = [(0.0, 10.0), (10.5, math.inf)]
    rank0 = [[1.0, 2.0], [9.0, 9.9], [9.9, 10.6], [10.6, 11.0], [12.0, 13.0]]
    rank1 = [[1.0, 2.0], [9.0, 10.1], [10.1, 10.6], [10.4, 11.0], [12.0, 13.0]]
    # step 1 ends after the change on rank 1, step 2 straddles it, step 3 starts before the settling ends
    assert attribute([rank0, rank1], windows) == [0, None, None, None, 1]
    assert attribute([rank0], windows) == [0, 0, None, 1, 1]


def _raw(applied):
    # two ranks; "fast" steps 0.1 s in phase 1 and 0.2 s in phase 2, "slow" 0.2 s then 1.0 s
    def series(d1, d2, t):
        stamps, times = [], []
        for d in [d1] * 3 + [d2] * 3:
            stamps.append([t, t + d])
            times.append(d)
            t += d + (5.0 if len(times) == 3 else 0.0)  # the second three run after the change
        return times, stamps
    out = {"settings": {"steps_per_round": 3}, "meta": {"local_batch": 8, "world_size": 2},
           "bandwidth_trace": {"phases": [{"rate": "x1", "rate_bps": 2e8, "duration_s": 4, "start_s": 0},
                                          {"rate": "x0.1", "rate_bps": 2e7, "duration_s": 4, "start_s": 4}],
                               "applied": applied},
           "step_times_s": {}, "step_stamps_s": {}}
    for name, d1, d2 in (("compute", 0.1, 0.1), ("comm", 0.05, 0.5), ("fast", 0.1, 0.2), ("slow", 0.2, 1.0)):
        times, stamps = series(d1, d2, 100.0)
        out["step_times_s"][name] = [times, times]
        out["step_stamps_s"][name] = [stamps, stamps]
    return out


def test_phase_results_give_each_strategy_its_samples_per_second_in_each_phase():
    applied = [{"phase": 0, "rate_bps": 2e8, "began": 100.0, "ended": 100.0},
               {"phase": 1, "rate_bps": 2e7, "began": 104.0, "ended": 104.2}]
    fast, slow = (ph["runners"] for ph in phase_results(_raw(applied)))
    assert fast["fast"]["steps"] == 3 and fast["fast"]["samples_per_s"] == pytest.approx(16 / 0.1)
    assert fast["slow"]["samples_per_s"] == pytest.approx(16 / 0.2) and fast["slow"]["vs_best"] == pytest.approx(0.5)
    assert slow["fast"]["median_step_s"] == pytest.approx(0.2) and slow["slow"]["vs_best"] == pytest.approx(0.2)
    assert slow["slow"]["mean_step_s"] == pytest.approx(1.0) and fast["fast"]["max_step_s"] == pytest.approx(0.1)
    assert "samples_per_s" not in slow["comm"] and slow["comm"]["median_step_s"] == pytest.approx(0.5)
    ph = phase_results(_raw(applied))
    assert ph[1]["comm_compute"] == pytest.approx(5.0) and ph[1]["window_s"] == [pytest.approx(4.3), None]
    # the change applied late, while "fast" ran its second three steps (105.3-105.9 s): the two
    # steps around it and the settling count for no phase, the one after for the new phase
    late = [applied[0], {"phase": 1, "rate_bps": 2e7, "began": 105.45, "ended": 105.5}]
    ph = phase_results(_raw(late))
    assert [p["runners"]["fast"]["steps"] for p in ph] == [3, 1] and ph[0]["unattributed_steps"]["fast"] == 2


def test_the_controller_applies_each_phase_at_its_start_from_the_marker_time(tmp_path):
    phases = [{"start_s": 0.0, "duration_s": 0.2, "rate_bps": 1e9, "rate": "x1"},
              {"start_s": 0.2, "duration_s": 0.2, "rate_bps": 1e8, "rate": "x0.1"},
              {"start_s": 0.4, "duration_s": 0.2, "rate_bps": 1e9, "rate": "x1"}]
    marker, calls = tmp_path / "start", []
    ctl = TraceController(phases, marker, lambda bps: calls.append((time.time(), bps)), log=open("/dev/null", "w"))
    ctl.start()
    time.sleep(0.1)
    assert not calls and not ctl.applied  # nothing before the measured rounds begin
    t0 = time.time()
    marker.write_text(repr(t0))
    ctl.join(timeout=5)
    assert not ctl.is_alive()
    assert [bps for _, bps in calls] == [1e8, 1e9]
    assert [a["phase"] for a in ctl.applied] == [0, 1, 2] and ctl.applied[0]["began"] == t0
    for (t, _), start in zip(calls, (0.2, 0.4)):
        assert t0 + start <= t < t0 + start + 0.15


def test_a_stopped_controller_changes_nothing_and_a_failed_change_is_logged(tmp_path):
    ctl = TraceController([{"start_s": 0.0, "duration_s": 1, "rate_bps": 1e9, "rate": "x1"}], tmp_path / "m",
                          lambda bps: None)
    ctl.start()
    ctl.stop()
    ctl.join(timeout=5)
    assert not ctl.is_alive() and ctl.applied == []

    def fail(bps):
        raise CaramelError("tc said no")
    (tmp_path / "m2").write_text(repr(time.time()))
    ctl = TraceController([{"start_s": 0.0, "duration_s": 0.05, "rate_bps": 1e9, "rate": "x1"},
                           {"start_s": 0.05, "duration_s": 1, "rate_bps": 1e8, "rate": "x0.1"}], tmp_path / "m2", fail,
                          log=open("/dev/null", "w"))
    ctl.start()
    ctl.join(timeout=5)
    assert ctl.applied[1]["error"] == "tc said no" and "ended" not in ctl.applied[1]


class _Runner(Runner):
    def __init__(self, step_s: float):
        self.step_s = step_s

    def step(self) -> None:
        time.sleep(self.step_s)

    def settled(self) -> bool:
        return True

    def finish(self) -> None:
        pass


def _rounds_worker(rank: int, world: int, marker: str) -> dict:
    from caramel.bench import harness
    from caramel.bench.matrix import BenchSettings
    from caramel.bench.trace_control import TraceClock

    trace = TraceClock({"marker": marker, "phases": [{"duration_s": 0.3}, {"duration_s": 0.3}]}, rank)
    runners = {"a": _Runner(0.01 * (1 + rank)), "b": _Runner(0.02)}
    settings = BenchSettings(rounds=1, steps_per_round=3, warmup_steps=0)
    t = time.time()
    times = harness.measure_rounds(runners, settings, "test", rank, trace)
    return {"elapsed": time.time() - trace.t0, "t0": trace.t0, "t_before": t, "steps": {n: len(v) for n, v in times.items()},
            "stamps": {n: len(v) for n, v in trace.stamps.items()}, "ordered": all(
                s[0] <= s[1] for v in trace.stamps.values() for s in v)}


def test_measured_rounds_run_until_the_trace_ends_the_same_on_every_rank(tmp_path):
    from caramel.testing import run_workers

    marker = tmp_path / "start"
    res = run_workers(_rounds_worker, 2, args=(str(marker),), timeout_s=60)
    assert res[0]["steps"] == res[1]["steps"] and res[0]["steps"]["a"] >= 6  # more than the one round asked
    for r in res:
        assert r["stamps"] == r["steps"] and r["ordered"] and r["elapsed"] >= 0.6
    assert float(marker.read_text()) == res[0]["t0"]  # rank 0 wrote time zero for the launcher


def _args(*flags):
    import argparse

    from caramel.bench.cli import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(flags))


def test_the_cli_refuses_a_trace_it_cannot_run_before_any_job_starts(tmp_path):
    from caramel.bench.cli import _check_trace_args, _trace_phases, run
    from caramel.bench.matrix import BenchConfig

    f = tmp_path / "t.json"
    f.write_text('[{"duration_s": 30, "rate": "x1"}, {"duration_s": 30, "rate": "x0.1"}]')
    with pytest.raises(CaramelError, match=r"--rounds 3 with --bandwidth-trace: the rounds run until"):
        run(_args("--bandwidth-trace", str(f), "--rounds", "3", "--ratio", "1"))
    with pytest.raises(CaramelError, match=r"cannot run with --network loopback"):
        run(_args("--bandwidth-trace", str(f), "--network", "loopback", "--ratio", "1"))
    # a pinned-rate point: x rates scale it, and the links start at phase 1's rate
    trace = _check_trace_args(_args("--bandwidth-trace", str(f), "--bandwidth", "200mbit"))
    cfg, phases = _trace_phases(trace, BenchConfig(model="resnet18", workers=2, bandwidth="200mbit"))
    assert cfg.bandwidth == "200mbit" and [p["rate_bps"] for p in phases] == [200e6, pytest.approx(20e6)]
    # no rate to scale: the relative trace is refused, naming the phase
    with pytest.raises(CaramelError, match=r"phase 1: rate x1 is relative"):
        run(_args("--bandwidth-trace", str(f), "--model", "resnet18"))
    # an absolute trace without a rate: the links are built at phase 1's rate
    f.write_text("30,1gbit\n30,100mbit\n")
    cfg, _ = _trace_phases(_check_trace_args(_args("--bandwidth-trace", str(f))), BenchConfig(model="resnet18", workers=2))
    assert cfg.bandwidth == "1gbit"


def test_a_marker_created_before_its_time_is_written_is_read_again(tmp_path):
    marker, calls = tmp_path / "start", []
    marker.write_text("")  # created, not yet written: what a reader can see mid-write
    ctl = TraceController([{"start_s": 0.0, "duration_s": 0.05, "rate_bps": 1e9, "rate": "x1"},
                           {"start_s": 0.05, "duration_s": 0.05, "rate_bps": 1e8, "rate": "x0.1"}],
                          marker, lambda bps: calls.append(bps), log=open("/dev/null", "w"))
    ctl.start()
    time.sleep(0.2)
    marker.write_text(repr(time.time()))
    ctl.join(timeout=5)
    assert not ctl.is_alive() and calls == [1e8]
