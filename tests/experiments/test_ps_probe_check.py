"""experiments/ps_probe_check.py fails a run whose traffic probe predates version 5, lacks one of
its fields (or holds it null), or is absent from any record of a configuration; it reports the
curves' time against their budget, and stays off torch (it reads stored JSON only)."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs/results/ps_sim_pull_flows/w4/bench.json"  # probe version 4, 4 workers
V5 = ROOT / "docs/results/ps_sim_probe5"  # probe version 5: w2/ and w4/, one configuration each


def _as_v5(tmp_path, curve_s, set_field=None, drop=None):
    d = json.loads(RUN.read_text())
    for r in d["records"]:
        p = (r.get("link_fit") or {}).get("traffic_probe")
        if p:
            p.update(version=5, curve_counts=[1, 2, 3], curve_reps=15, curve_budget_s=20.0,
                     curve_s=curve_s, probe_s=curve_s + 4.0)
            p.update(set_field or {})
            if drop:
                del p[drop]
    out = tmp_path / f"bench-{curve_s}-{drop}-{len(set_field or {})}.json"
    out.write_text(json.dumps(d))
    return str(out)


def _write(tmp_path, d, name="bench.json"):
    out = tmp_path / name
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

    within = _as_v5(tmp_path, curve_s=8.5)
    (row,) = check_run(within)
    assert row["problems"] == [] and row["curves_within_budget"] is True
    assert main([within]) == 0
    (over,) = check_run(_as_v5(tmp_path, curve_s=23.0))
    assert over["problems"] == [] and over["curves_within_budget"] is False  # reported, not a failure


def test_a_missing_or_null_field_fails(tmp_path, capsys):
    from experiments.ps_probe_check import main

    assert main([_as_v5(tmp_path, curve_s=8.5, drop="curve_reps")]) == 1
    assert "missing curve_reps" in capsys.readouterr().out
    assert main([_as_v5(tmp_path, curve_s=8.5, set_field={"curve_budget_s": None})]) == 1
    assert "missing curve_budget_s" in capsys.readouterr().out
    assert main([_as_v5(tmp_path, curve_s=8.5, set_field={"broadcasts_at_once_reps_s": []})]) == 1
    assert "missing broadcasts_at_once_reps_s" in capsys.readouterr().out


def test_a_configuration_without_a_probe_fails(tmp_path, capsys):
    from experiments.ps_probe_check import main

    d = json.loads(RUN.read_text())
    for r in d["records"]:
        r["link_fit"].pop("traffic_probe", None)
    assert main([_write(tmp_path, d)]) == 1
    assert "no traffic probe in any record" in capsys.readouterr().out


def test_every_record_of_every_configuration_is_checked(tmp_path):
    from experiments.ps_probe_check import check_run

    w2, w4 = (json.loads((V5 / n / "bench.json").read_text()) for n in ("w2", "w4"))
    both = copy.deepcopy(w2)
    both["records"] += w4["records"]
    both["meta"]["prediction_inputs"].update(w4["meta"]["prediction_inputs"])
    rows = {r["config"].split(" @ ")[0]: r for r in check_run(_write(tmp_path, both, "both.json"))}
    assert sorted(rows) == ["resnet18(b=8,width=16) x2", "resnet18(b=8,width=16) x4"]
    assert all(r["problems"] == [] and r["version"] == 5 for r in rows.values())
    # a later record losing the probe, or holding another one, is no longer passed over
    both["records"][-1]["link_fit"].pop("traffic_probe")
    both["records"][1]["link_fit"]["traffic_probe"]["version"] = 4
    rows = {r["config"].split(" @ ")[0]: r for r in check_run(_write(tmp_path, both, "both.json"))}
    assert rows["resnet18(b=8,width=16) x4"]["problems"] == ["1 of 3 records have no traffic probe"]
    assert rows["resnet18(b=8,width=16) x2"]["problems"] == [
        "the records' traffic probes differ (one job, one probe expected)"]


def test_a_file_that_is_not_a_bench_json_is_one_clear_error(tmp_path):
    from experiments.ps_probe_check import main

    bad = tmp_path / "bench.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=r"cannot read .*bench\.json as JSON.*expected a bench JSON"):
        main([str(bad)])
    bad.write_text("[]")
    with pytest.raises(SystemExit, match=r"is not a bench JSON"):
        main([str(bad)])


def test_the_checker_does_not_import_torch():
    code = ("import sys; from experiments.ps_probe_check import check_run; "
            f"check_run({str(RUN)!r}); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, check=True, timeout=60)
