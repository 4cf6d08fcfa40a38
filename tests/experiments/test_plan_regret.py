"""experiments/plan_regret.py on the plan inputs kept from a bench run: planning for the input spread
loses less to the best plan under another instance's inputs than planning for the inputs exactly."""
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "plan-inputs" / "bench-2026-12-04-1507"

pytestmark = pytest.mark.timeout(300)


def _script():
    from experiments import plan_regret
    return plan_regret


def test_the_spread_loses_less_under_other_instances_inputs():
    lines = []
    found = _script().regrets(DATA, [0.0, 0.25], ["backward"], out=lines.append)
    assert len(lines) == 5 and all(" backward " in line for line in lines)
    assert len(found[0.0]) == len(found[0.25]) == 5 * 3 * 2  # five configurations, 3 x 2 ordered pairs each
    assert statistics.fmean(found[0.25]) < 0.5 * statistics.fmean(found[0.0])


def test_a_folder_without_plan_inputs_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "config").mkdir()
    with pytest.raises(SystemExit):
        _script().main([str(tmp_path)])
    assert "no configuration folder holds saved plan inputs" in capsys.readouterr().err
