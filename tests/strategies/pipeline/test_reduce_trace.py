"""The stage timer's record of the replicas' reduction (Caramel's engine's collectives), without processes."""
from __future__ import annotations

import collections
import json
from types import SimpleNamespace

from caramel.strategies.pipeline.timing import StageTimer


class FakeDispatcher:
    def __init__(self) -> None:
        self.log: collections.deque = collections.deque()
        self.measuring = False

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


def test_the_bench_saves_the_plan_and_each_steps_collectives(tmp_path, monkeypatch):
    from caramel.bench import strategies

    timer, d = _timer_with_steps()
    timer._actions = [("B", 0, 0, 2.0, 3.0)]
    d.log.append((2.5, 2.9, 400))
    timer.end_step()
    runner = SimpleNamespace(pipe=SimpleNamespace(timer=timer), trace_dir=str(tmp_path), name="pipeline:replicas=2")
    monkeypatch.setattr(strategies, "ctx_rank", lambda: 3)
    strategies.PipelineRunner._save_actions(runner)
    (path,) = tmp_path.glob("pipeline_actions.*.rank3.json")
    record = json.loads(path.read_text())
    assert record["reduce_plan"] == [[1, 0, 400], [0, 0, 800]]
    assert record["reduces"] == [[[400, 2.5, 2.9]]] and record["steps"] == [[["B", 0, 0, 2.0, 3.0]]]
    # without an engine the record is what it was: no reduction fields
    plain = StageTimer()
    plain._actions = [("B", 0, 0, 2.0, 3.0)]
    plain.end_step()
    runner.pipe.timer = plain
    strategies.PipelineRunner._save_actions(runner)
    assert set(json.loads(path.read_text())) == {"strategy", "rank", "steps"}
