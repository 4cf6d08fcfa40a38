"""experiments/ps_order_paths.py: bad options and a run without E are one clear error; the
table is written again from a stored result (the S column is the median over rounds)."""
import json
import shutil
from pathlib import Path

import pytest

import experiments.ps_order_paths as ps_order_paths
from experiments.ps_order_paths import check_e, main, parse_args

RESULTS = Path(__file__).resolve().parents[2] / "docs/results"


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--rounds", "0"], "--rounds: expected at least 1"),
    (["--out", "x", "--steps", "10", "--warmup", "10"], "expected 0 <= warmup < steps"),
    (["--out", "x", "--warmup", "-1"], "expected 0 <= warmup < steps"),
    (["--out", "x", "--configs", "dedicated,flat"], "--configs: unknown ['flat']"),
    ([], "--out PATH is required"),
    (["--from-json", "x.md"], "--from-json: expected a PATH.json"),
    (["--from-json", "x.json", "--out", "y"], "--out (run options, or --out) cannot be used with it"),
    (["--from-json", "x.json", "--rounds", "0", "--configs", "bogus"], "--rounds, --configs (run options"),
    (["--from-json", "/nonexistent/x.json"], "--from-json: no such file '/nonexistent/x.json'"),
])
def test_bad_options_are_one_error_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_run_without_e_names_the_job():
    with pytest.raises(SystemExit, match="job round 1 dedicated tac: the run reported no TicTac E"):
        check_e({"E_median": None, "S": 0.3}, "round 1 dedicated tac")
    check_e({"E_median": 0.9, "S": 0.3}, "round 0 dedicated tac")


def test_the_table_is_written_again_from_the_stored_result(tmp_path):
    src = RESULTS / "ps_order_paths_hier100.json"
    shutil.copy(src, tmp_path / src.name)
    (tmp_path / "ps_order_paths_hier100.md").write_text("# old\n\n## Reading\n\nkept\n")
    main(["--from-json", str(tmp_path / src.name)])
    text = (tmp_path / "ps_order_paths_hier100.md").read_text()
    assert text.endswith("\n## Reading\n\nkept\n") and "# old" not in text
    assert f"Command: `{json.loads(src.read_text())['command']}`" in text
    assert "| S of TAC (rounds) |" in text and "| 0.63 (0.85, 0.63, 0.62, 0.63) |" in text
    assert (RESULTS / "ps_order_paths_hier100.md").read_text().startswith(text[:text.index("\n## Reading")])


def test_a_stored_file_of_another_shape_is_one_error_naming_it(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text('{"jobs": []}')
    with pytest.raises(SystemExit, match=f"--from-json '{bad}': not a stored ps_order_paths result"):
        main(["--from-json", str(bad)])
    assert not (tmp_path / "other.md").exists()


def test_each_page_names_only_the_configurations_its_result_ran():
    for name, ran, title in (
            ("ps_order_paths", {"dedicated", "hierarchical"}, "dedicated servers and hierarchical aggregation at 300mbit"),
            ("ps_order_paths_ded100", {"dedicated"}, "dedicated servers at 100mbit"),
            ("ps_order_paths_hier100", {"hierarchical"}, "hierarchical aggregation at 100mbit")):
        text = ps_order_paths.markdown(json.loads((RESULTS / f"{name}.json").read_text()))
        assert text.startswith(f"# TAC against random order: {title}\n"), name
        description = text.split("\n")[4]
        named = {c for c, (_, setup) in ps_order_paths.SETUPS.items() if f"{c}: {setup}" in description}
        assert named == ran, (name, named)


def test_a_job_without_e_keeps_the_jobs_so_far(tmp_path, monkeypatch):
    results = iter([{"median_step_ms": 10.0, "E_median": 0.9, "S": 0.5, "load_before": 1.0},
                    {"median_step_ms": 11.0, "E_median": None, "S": None}])
    monkeypatch.setattr(ps_order_paths, "run_job", lambda *a: next(results))
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=f"round 0 dedicated tac: .*the jobs so far: {out}.partial.json"):
        main(["--out", str(out), "--rounds", "1", "--configs", "dedicated"])
    jobs = json.loads((tmp_path / "run.partial.json").read_text())["jobs"]
    assert [(j["order"], j["E_median"]) for j in jobs] == [("random", 0.9), ("tac", None)]
