"""experiments/ps_order_paths.py: bad options and a run without E are one clear error; the
table is written again from a stored result (the S column is the median over rounds)."""
import json
import shutil
from pathlib import Path

import pytest

from experiments.ps_order_paths import check_e, main, parse_args

RESULTS = Path(__file__).resolve().parents[2] / "docs/results"


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--rounds", "0"], "--rounds: expected at least 1"),
    (["--out", "x", "--steps", "10", "--warmup", "10"], "expected 0 <= warmup < steps"),
    (["--out", "x", "--warmup", "-1"], "expected 0 <= warmup < steps"),
    (["--out", "x", "--configs", "dedicated,flat"], "--configs: unknown ['flat']"),
    ([], "--out PATH is required"),
    (["--from-json", "x.md"], "--from-json: expected a PATH.json"),
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
