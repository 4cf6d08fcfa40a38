"""The stage timer's record of the replicas' reduction (Caramel's engine's collectives), without processes."""
from __future__ import annotations

import collections
import json
from types import SimpleNamespace

import pytest

from caramel.errors import CaramelError
from caramel.strategies.pipeline.timing import StageTimer


class FakeDispatcher:
    def __init__(self) -> None:
        self.log: collections.deque = collections.deque()
        self.measuring = False
        self.measurers = 0

    def start_measuring(self) -> None:
        self.measuring = True


def _timer_with_steps() -> tuple[StageTimer, FakeDispatcher]:
    d = FakeDispatcher()
    timer = StageTimer()
    timer.watch_reduces(d, [(1, 0, 400), (0, 0, 800)])
    return timer, d


def test_each_collective_goes_to_the_step_that_issued_it_even_when_done_later():
    timer, d = _timer_with_steps()
    assert d.measuring and timer.reduce_plan == [(1, 0, 400), (0, 0, 800)]
    timer._actions = [("F", 0, 0, 1.0, 1.5), ("B", 0, 0, 2.0, 3.0)]
    d.log.append((2.5, 2.9, 400))  # the first bucket done inside step 0's backward
    timer.end_step()
    # step 0's second bucket completes during step 1; step 1's first before step 1 ends
    timer._actions = [("F", 0, 0, 4.0, 4.5), ("B", 0, 0, 5.0, 6.0)]
    d.log.extend([(2.95, 4.2, 800), (5.5, 5.9, 400)])
    timer.end_step()
    s0, s1 = timer.steps
    assert s0.reduces == [(400, 2.5, 2.9), (800, 2.95, 4.2)]
    assert s1.reduces == [(400, 5.5, 5.9)]
    assert not d.log
    d.log.append((5.99, 6.4, 800))  # arrives after the last step: kept on it at the next drain
    timer.end_step()  # no actions: no new step
    assert len(timer.steps) == 2 and s1.reduces[-1] == (800, 5.99, 6.4)


def test_a_timer_without_an_engine_records_no_plan_and_no_collectives():
    timer = StageTimer()
    timer._actions = [("F", 0, 0, 1.0, 1.5)]
    timer.end_step()
    assert timer.reduce_plan == [] and timer.steps[0].reduces == []


def _save(timer: StageTimer, tmp_path, monkeypatch) -> dict:
    from caramel.bench import strategies

    runner = SimpleNamespace(pipe=SimpleNamespace(timer=timer), trace_dir=str(tmp_path), name="pipeline:replicas=2")
    monkeypatch.setattr(strategies, "ctx_rank", lambda: 3)
    strategies.PipelineRunner._save_actions(runner)
    (path,) = tmp_path.glob("pipeline_actions.*.rank3.json")
    return json.loads(path.read_text())


def test_the_bench_saves_the_plan_and_each_steps_collectives(tmp_path, monkeypatch):
    timer, d = _timer_with_steps()
    timer._actions = [("B", 0, 0, 2.0, 3.0)]
    d.log.append((2.5, 2.9, 400))
    timer.end_step()
    d.log.append((2.95, 3.4, 800))  # the step's second bucket, done after its end_step: drained on saving
    record = _save(timer, tmp_path, monkeypatch)
    assert record["format"] == "caramel.pipeline_actions/2"
    assert record["reduce_plan"] == [[1, 0, 400], [0, 0, 800]]
    assert record["reduces"] == [[[400, 2.5, 2.9], [800, 2.95, 3.4]]] and record["steps"] == [[["B", 0, 0, 2.0, 3.0]]]
    assert record["reduces_last_step_partial"] is False
    # without an engine the record is what it was, tagged: no reduction fields
    plain = StageTimer()
    plain._actions = [("B", 0, 0, 2.0, 3.0)]
    plain.end_step()
    assert _save(plain, tmp_path, monkeypatch) == {"format": "caramel.pipeline_actions/1", "strategy": "pipeline:replicas=2",
                                                   "rank": 3, "steps": [[["B", 0, 0, 2.0, 3.0]]]}


def test_the_last_steps_unfinished_collectives_are_flagged(tmp_path, monkeypatch):
    timer, d = _timer_with_steps()
    timer._actions = [("B", 0, 0, 2.0, 3.0)]
    d.log.append((2.5, 2.9, 400))  # the second bucket still on the wire when the record is saved
    timer.end_step()
    record = _save(timer, tmp_path, monkeypatch)
    assert record["reduces"] == [[[400, 2.5, 2.9]]] and record["reduces_last_step_partial"] is True


def test_an_engine_with_an_empty_plan_still_records_its_fields(tmp_path, monkeypatch):
    timer = StageTimer()
    timer.watch_reduces(FakeDispatcher(), [])
    timer._actions = [("B", 0, 0, 2.0, 3.0)]
    timer.end_step()
    record = _save(timer, tmp_path, monkeypatch)
    assert record["reduce_plan"] == [] and record["reduces"] == [[]] and record["reduces_last_step_partial"] is False


def test_a_log_someone_else_measures_is_refused():
    d = FakeDispatcher()
    d.measurers = 1  # e.g. the engine's online profiler
    with pytest.raises(CaramelError, match=r"already has 1 reader\(s\)"):
        StageTimer().watch_reduces(d, [(0, 0, 8)])
    assert not d.measuring


def test_an_engine_that_reads_its_own_log_is_refused():
    from caramel.strategies.pipeline.replica_reduce import watch_engine_reduces

    def engine(profiler=None, trial=None, check_every=0):
        controller = SimpleNamespace(profiler=profiler, trial=trial, checks=SimpleNamespace(check_every=check_every))
        return SimpleNamespace(controller=controller, _dispatcher=FakeDispatcher(), buckets=[])

    with pytest.raises(CaramelError, match="its periodic checks also read"):
        watch_engine_reduces(StageTimer(), engine(check_every=50))
    with pytest.raises(CaramelError, match="its online profiling and an overlap trial also read"):
        watch_engine_reduces(StageTimer(), engine(profiler=object(), trial=object()))
    timer, quiet = StageTimer(), engine()
    quiet._dispatcher.order = []
    watch_engine_reduces(timer, quiet)
    assert timer.watching_reduces and quiet._dispatcher.measuring
