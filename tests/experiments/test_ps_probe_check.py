"""experiments/ps_probe_check.py fails a run whose traffic probe predates version 5 or lacks one of
its fields, and reports the curves' time against their budget."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs/results/ps_sim_pull_flows/w4/bench.json"  # probe version 4, 4 workers


def _as_v5(tmp_path, curve_s, drop=None):
    d = json.loads(RUN.read_text())
    for r in d["records"]:
        p = (r.get("link_fit") or {}).get("traffic_probe")
        if p:
            p.update(version=5, curve_counts=[1, 2, 3], curve_reps=15, curve_budget_s=20.0,
                     curve_s=curve_s, probe_s=curve_s + 4.0)
            if drop:
                del p[drop]
    out = tmp_path / "bench.json"
    out.write_text(json.dumps(d))
    return str(out)


def test_an_older_probe_is_a_failure_naming_the_missing_fields():
    from experiments.ps_probe_check import check_run

    (row,) = check_run(str(RUN))
    assert row["version"] == 4
    assert any("version 4" in p for p in row["problems"])
    assert any("curve_s" in p and "probe_s" in p for p in row["problems"])
    # the shares the model read and the all-at-once repetitions, sorted (two modes: 51-54, 63-76 ms)
    assert [round(x, 2) for x in row["pull_efficiency_by_count"]] == [1.03, 0.97, 0.81, 0.56]
    assert len(row["all_at_once_reps_s"]) == 15 and row["all_at_once_reps_s"] == sorted(row["all_at_once_reps_s"])


def test_a_version_5_probe_passes_and_its_budget_is_reported(tmp_path):
    from experiments.ps_probe_check import check_run, main

    (row,) = check_run(_as_v5(tmp_path, curve_s=8.5))
    assert row["problems"] == [] and row["curves_within_budget"] is True
    assert main([_as_v5(tmp_path, curve_s=8.5)]) == 0
    (over,) = check_run(_as_v5(tmp_path, curve_s=23.0))
    assert over["problems"] == [] and over["curves_within_budget"] is False  # reported, not a failure


def test_a_missing_field_fails(tmp_path, capsys):
    from experiments.ps_probe_check import main

    assert main([_as_v5(tmp_path, curve_s=8.5, drop="curve_reps")]) == 1
    assert "missing curve_reps" in capsys.readouterr().out
