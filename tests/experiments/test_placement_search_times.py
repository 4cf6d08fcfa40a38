"""The search's own time read from an edge_placement result: each searched row's mean time
minus its start's, over the plain search's after the same start; on the stored guided-search
run it gives the numbers docs/rl-scheduling.md states."""
from pathlib import Path

import pytest

from caramel.jsonio import read_json
from experiments.placement_search_times import main, search_own_times_ms, start_of

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "rl"


def test_the_search_alone_is_the_row_minus_its_start():
    section = {"solve_s_per_instance": {"ppo": [0.009, 0.011], "ppo+search": [0.011, 0.015],
                                        "ppo+guided:0.03": [0.014, 0.016], "greedy_regret": [0.01, 0.01],
                                        "greedy_regret+search": [0.013, 0.013]}}
    rows = search_own_times_ms(section)
    assert set(rows) == {"ppo+search", "ppo+guided:0.03", "greedy_regret+search"}
    assert rows["ppo+search"]["own_ms"] == pytest.approx(3.0) and rows["ppo+search"]["over_plain"] == pytest.approx(1)
    assert rows["ppo+guided:0.03"]["own_ms"] == pytest.approx(5.0)
    assert rows["ppo+guided:0.03"]["over_plain"] == pytest.approx(5 / 3)
    assert rows["greedy_regret+search"] == {"start": "greedy_regret", "own_ms": pytest.approx(3.0),
                                            "over_plain": pytest.approx(1)}
    assert start_of("ppo") is None and start_of("ppo+random:0.1") == "ppo"


def test_the_stored_guided_run_reads_as_documented(capsys):
    path = RESULTS / "edge_placement_guided.json"
    rows = search_own_times_ms(read_json(path, "edge-placement")["large"])
    assert round(rows["ppo+search"]["own_ms"], 2) == 2.49 and round(rows["ppo+guided:0.03"]["own_ms"], 2) == 3.37
    assert round(rows["ppo+guided:0.03"]["over_plain"], 2) == 1.35
    assert main([str(path)]) == 0 and "1.35 times ppo+search's" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(path), "--section", "medium"])
