"""Timeline evidence: compute and hidden communication net of time blocked on communication."""
import pytest

from caramel.bench.evidence import attach_evidence, timeline_evidence
from caramel.trace.events import Trace, TraceEvent


def _ev(lane, kind, start, dur, it):
    return TraceEvent(rank=0, lane=lane, kind=kind, name=kind, start_s=start, duration_s=dur, iteration=it)


def _trace():
    # step 0 runs from its forward at t=0 to the next forward at t=20
    return Trace("measured", 1, [
        _ev("compute", "forward", 0.0, 6.0, 0),    # forward 0..6, blocked 2..5 inside it
        _ev("wait", "wait", 2.0, 3.0, 0),
        _ev("compute", "backward", 6.0, 4.0, 0),   # backward 6..10
        _ev("comm", "comm", 1.0, 3.0, 0),          # 1..4: 1 s behind real compute, 2 s behind waiting
        _ev("comm", "comm", 8.0, 6.0, 0),          # 8..14: 2 s behind backward, 4 s exposed
        _ev("compute", "forward", 20.0, 5.0, 1),
    ])


def test_net_of_waiting(tmp_path):
    _trace().save(tmp_path / "caramel.json")
    ev = timeline_evidence(tmp_path, "caramel")
    assert ev["compute_s"] == pytest.approx(10.0)          # the compute lane, waiting included
    assert ev["wait_s"] == pytest.approx(3.0)
    assert ev["busy_compute_s"] == pytest.approx(7.0)      # 10 - 3 blocked
    assert ev["comm_s"] == pytest.approx(9.0)
    assert ev["hidden_comm_s"] == pytest.approx(5.0)       # 3 + 2, counting the blocked time
    assert ev["busy_hidden_comm_s"] == pytest.approx(3.0)  # 1 + 2 behind real computation


def test_only_this_strategys_files(tmp_path):
    _trace().save(tmp_path / "caramel_overlap_backward.rank0.json")
    assert timeline_evidence(tmp_path, "caramel") is None
    assert timeline_evidence(tmp_path, "caramel:overlap=backward")["busy_compute_s"] == pytest.approx(7.0)
    raw = {"strategies": [{"name": "ddp"}, {"name": "caramel:overlap=backward"}], "settings": {"warmup_steps": 0}}
    attach_evidence(raw, str(tmp_path))
    assert set(raw["timeline"]) == {"caramel:overlap=backward"}
