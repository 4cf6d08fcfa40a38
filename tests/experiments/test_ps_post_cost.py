"""ps_post_cost's results file: rows land in their run (a spec measured again replaces its
rows), and the stored file reads back to the range docs/ps.md quotes."""
from pathlib import Path

import pytest

from caramel.jsonio import read_json
from experiments.ps_post_cost import KIND, add_rows

STORED = Path(__file__).resolve().parents[2] / "docs" / "results" / "ps_post_cost.json"


def _row(spec: str, rank: int, posting_ms: float) -> dict:
    return {"spec": spec, "rank": rank, "steps_kept": 15, "posting_ms_median": posting_ms,
            "posting_ms_max": posting_ms, "receives_per_step": 3, "backward_ms_median": 50.0}


def test_rows_go_to_their_run_and_a_spec_again_replaces_its_rows():
    data = add_rows(None, "1", [_row("ps", 0, 0.2), _row("ps", 1, 0.3)], ["load_before 1 1 1"], "cmd")
    assert data["format"] == f"caramel.{KIND}/1" and data["command"] == "cmd"
    data = add_rows(data, "1", [_row("ps:bucket_cap_mb=0", 0, 0.4)], ["load_before 2 2 2"], "cmd")
    data = add_rows(data, "2", [_row("ps", 0, 0.5)], [], "cmd")
    data = add_rows(data, "1", [_row("ps", 0, 0.9)], [], "cmd")
    assert [r["run"] for r in data["runs"]] == ["1", "2"]
    first = data["runs"][0]
    assert [(r["spec"], r["posting_ms_median"]) for r in first["rows"]] == [("ps:bucket_cap_mb=0", 0.4), ("ps", 0.9)]
    assert first["loads"] == ["load_before 1 1 1", "load_before 2 2 2"]


def test_the_stored_file_reads_as_documented():
    data = read_json(STORED, KIND)
    fused = [r for run in data["runs"] for r in run["rows"] if r["spec"] == "ps"]
    medians = sorted(round(r["posting_ms_median"], 2) for r in fused)
    shares = sorted(round(100 * r["posting_ms_median"] / r["backward_ms_median"], 1) for r in fused)
    # docs/ps.md: 0.2-0.3 ms except one 2.0 ms median, 0.3-2.3% of the backward
    assert 0.2 <= medians[0] and medians[-2] <= 0.35 and medians[-1] == pytest.approx(1.97)
    assert shares[0] == 0.3 and shares[-1] == 2.3
