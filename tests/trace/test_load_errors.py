"""Bad, truncated or mismatched trace files fail with one clear FormatError naming the file."""
from __future__ import annotations

import json

import pytest

from caramel.errors import FormatError
from caramel.trace.chrome import write_chrome
from caramel.trace.load import load_trace, load_traces
from tests.trace.tracesynth import split_by_rank, two_rank_trace

pytestmark = pytest.mark.timeout(60)


def _saved(tmp_path, name="run.rank0.json"):
    path = tmp_path / name
    split_by_rank(two_rank_trace())[0].save(path)
    return path


def test_truncated_file(tmp_path):
    path = _saved(tmp_path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(FormatError, match=r"run.rank0.json: not valid JSON .*truncated"):
        load_trace(path)


def test_missing_file_and_wrong_kind(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        load_trace(tmp_path / "nope.json")
    (tmp_path / "plan.json").write_text(json.dumps({"format": "caramel.plan/1"}))
    with pytest.raises(FormatError, match="is this a Caramel trace file"):
        load_trace(tmp_path / "plan.json")
    (tmp_path / "future.json").write_text(json.dumps({"format": "caramel.trace/9"}))
    with pytest.raises(FormatError, match="not supported by this version"):
        load_trace(tmp_path / "future.json")


@pytest.mark.parametrize("field,value,message", [
    ("start_s", "soon", "events\\[3\\].start_s must be a finite number"),
    ("start_s", None, "events\\[3\\].start_s must be a finite number"),
    ("rank", 5, "events\\[3\\].rank must be an integer in \\[0, 2\\)"),
    ("iteration", 1.5, "events\\[3\\].iteration must be an integer"),
    ("bucket", -1, "events\\[3\\].bucket must be a non-negative integer or null"),
    ("lane", "gpu", "events\\[3\\].lane is 'gpu'"),
    ("duration_s", -0.1, "events\\[3\\].duration_s must be >= 0"),
])
def test_bad_event_fields(tmp_path, field, value, message):
    path = _saved(tmp_path)
    data = json.loads(path.read_text())
    data["events"][3][field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=message):
        load_trace(path)


def test_malformed_event_and_missing_fields(tmp_path):
    path = _saved(tmp_path)
    data = json.loads(path.read_text())
    data["events"][0] = {"rank": 0}
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=r"events\[0\]\.lane is missing"):
        load_trace(path)
    del data["events"]
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="missing field 'events'"):
        load_trace(path)


def test_merging_conflicts(tmp_path):
    a = _saved(tmp_path, "a.json")
    b = _saved(tmp_path, "b.json")
    with pytest.raises(FormatError, match="rank 0 appears in both"):
        load_traces([a, b])
    pred = split_by_rank(two_rank_trace())[1]
    pred.source = "predicted"
    pred.save(tmp_path / "p.json")
    with pytest.raises(FormatError, match="cannot merge measured and predicted"):
        load_traces([a, tmp_path / "p.json"])


def test_directory_skips_chrome_output_but_needs_a_trace(tmp_path):
    write_chrome(two_rank_trace(), tmp_path / "merged.json")
    with pytest.raises(FormatError, match="no caramel trace files"):
        load_traces([tmp_path])
    _saved(tmp_path)
    assert {e.rank for e in load_traces([tmp_path]).events} == {0}
