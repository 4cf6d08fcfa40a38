"""`caramel trace merge|plot|summary|check` through the real entry point (in-process)."""
from __future__ import annotations

import json

import pytest

from caramel.cli import main
from tests.trace.tracesynth import split_by_rank, synthetic_plan, two_rank_trace

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run"
    for r, t in enumerate(split_by_rank(two_rank_trace())):
        t.save(d / f"run.rank{r}.json")
    synthetic_plan().save(tmp_path / "plan.json")
    return d


def test_merge_summary_check(run_dir, tmp_path, capsys):
    assert main(["trace", "merge", str(run_dir), "-o", str(tmp_path / "m.json"), "--json", str(tmp_path / "mr.json")]) == 0
    assert "16 flow arrows" in capsys.readouterr().out
    assert json.loads((tmp_path / "mr.json").read_text())["flows"] == 16
    assert "traceEvents" in json.loads((tmp_path / "m.json").read_text())

    assert main(["trace", "summary", str(run_dir), "--warmup-steps", "1", "--json", str(tmp_path / "s.json")]) == 0
    assert "p50 11.00 ms" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["aggregate"]["steps"] == 2

    assert main(["trace", "check", str(run_dir), "--plan", str(tmp_path / "plan.json"), "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["ok"] is True


def test_summary_with_prediction(run_dir, tmp_path, capsys):
    pred = two_rank_trace((11.0, 13.2, 11.0, 12.1))
    pred.source = "predicted"
    pred.save(tmp_path / "pred.json")
    assert main(["trace", "summary", str(run_dir), "--predicted", str(tmp_path / "pred.json"), "--json", str(tmp_path / "s.json")]) == 0
    assert "error 10.0%" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["prediction"]["step_time_error"] == pytest.approx(0.1)


def test_plot(run_dir, tmp_path):
    assert main(["trace", "plot", str(run_dir), "-o", str(tmp_path / "t.png"), "--steps", "2"]) == 0
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_errors_are_one_line_exit_2(run_dir, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "caramel.trace/1", "events": [')
    assert main(["trace", "summary", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json: not valid JSON" in err and "truncated" in err

    t = two_rank_trace()
    t.events = [e for e in t.events if not (e.kind == "wait" and e.rank == 1 and e.bucket == 0 and e.iteration == 2)]
    t.save(tmp_path / "gap.json")
    assert main(["trace", "check", str(tmp_path / "gap.json"), "--plan", str(tmp_path / "plan.json")]) == 2
    err = capsys.readouterr().err
    assert "rank 1 step 1 bucket 0: no wait event consumes it" in err and "1 problem(s)" in err


def test_help_lists_actions(capsys):
    with pytest.raises(SystemExit) as e:
        main(["trace", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(a in out for a in ("merge", "plot", "summary", "check"))
