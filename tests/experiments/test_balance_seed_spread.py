"""experiments/balance_seed_spread.py --summarize: a results file without usable paired losses is
one error naming the file (not a KeyError or a statistics error), and --results is not needed."""
import json
import sys

import pytest


def _write(tmp_path, data, kind="balance-seed-spread") -> str:
    from caramel.jsonio import format_tag
    path = tmp_path / "spread.json"
    path.write_text(json.dumps(data if kind is None else {"format": format_tag(kind), **data}))
    return str(path)


@pytest.mark.parametrize("kind, what", [(None, "found None"),
                                        ("balance-seed-spread-run", "found 'caramel.balance-seed-spread-run/1'")])
def test_summarize_refuses_a_file_not_of_the_study_kind_naming_it(tmp_path, kind, what):
    """A run's own output (or an untagged file) is not the gathered study --summarize reads."""
    from experiments.balance_seed_spread import summarize_file
    rows = [{"seed": 0, "balanced": [1.1], "equal": [1.0]}, {"seed": 1, "balanced": [0.9], "equal": [1.0]}]
    path = _write(tmp_path, {"paired": {"seeds": rows}}, kind)
    with pytest.raises(SystemExit) as e:
        summarize_file(path)
    assert path in str(e.value) and what in str(e.value) and "caramel.balance-seed-spread/1" in str(e.value)


def test_the_stored_study_summarizes_as_stored():
    from pathlib import Path

    from experiments.balance_seed_spread import summarize_file
    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "adapt-balance-seed-spread.json"
    stored = json.loads(path.read_text())["summary"]
    assert summarize_file(str(path)) == stored["all_pairs"]
    assert summarize_file(str(path), 5) == stored["first_5_per_seed"]


@pytest.mark.parametrize("data, what", [
    ({"seed0": {}}, "'paired' entry"),
    ({"paired": {"seeds": [{"seed": 0, "balanced": [1.0]}]}}, "'paired' entry"),
    ({"paired": {"seeds": [{"seed": 0, "balanced": [1.1, 1.2], "equal": [1.0, 1.0]}]}}, "at least 2 seeds"),
    ({"paired": {"seeds": [{"seed": 0, "balanced": [1.1], "equal": [1.0]},
                           {"seed": 1, "balanced": [], "equal": []}]}}, "at least 2 seeds"),
])
def test_summarize_refuses_a_file_without_enough_pairs_naming_it(tmp_path, data, what):
    from experiments.balance_seed_spread import summarize_file
    path = _write(tmp_path, data)
    with pytest.raises(SystemExit) as e:
        summarize_file(path)
    assert path in str(e.value) and what in str(e.value)


def test_summarize_reads_the_pairs_per_seed(tmp_path):
    from experiments.balance_seed_spread import summarize_file
    rows = [{"seed": 0, "balanced": [1.1, 1.0], "equal": [1.0, 1.0]}, {"seed": 1, "balanced": [0.9], "equal": [1.0]}]
    path = _write(tmp_path, {"paired": {"seeds": rows}})
    s = summarize_file(path)
    assert s["pairs"] == 3 and s["mean_pct"] == pytest.approx((10.0 + 0.0 - 10.0) / 3)
    assert s["mean_of_seed_means_pct"] == pytest.approx((5.0 - 10.0) / 2)


def test_summarize_refuses_results(tmp_path, monkeypatch, capsys):
    from experiments.balance_seed_spread import main
    monkeypatch.setattr(sys, "argv", ["balance_seed_spread.py", "--summarize", "--json", str(tmp_path / "s.json"),
                                      "--results", "x.json"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "--results" in capsys.readouterr().err
