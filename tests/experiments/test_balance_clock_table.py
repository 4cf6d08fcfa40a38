"""experiments/balance_clock_table.py: another checkout's controller loads as its own module and
runs on the virtual clock like this one's; a path that is no file is one clear error."""
import pytest

import caramel.strategies.caramel.balance as balance
from experiments.balance_clock_table import SCENARIOS, load_balancer
from tests.strategies.adapt.balance_clock import Clock, run
from tests.strategies.adapt.test_balance_settle import COSTS_S, trial_schedule


def test_another_controller_runs_on_the_clock_as_this_one():
    other = load_balancer(balance.__file__)
    assert other is not balance.Balancer
    kw = SCENARIOS["rank 0 1.4x for its first 10 steps (warm-up)"]
    same = [run(Clock(COSTS_S, 256, 40, schedules=trial_schedule, noise=0.03, seed=1, **kw), b)["counts"]
            for b in (other, balance.Balancer)]
    assert same[0] == same[1] and same[0][-1] != [128, 128]


def test_old_that_is_no_file_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="--old .*: not a balance.py file"):
        load_balancer(str(tmp_path / "missing.py"))
