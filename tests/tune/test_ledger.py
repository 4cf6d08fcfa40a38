"""Budget accounting of `--measure real`: each method is charged the real steps of each distinct
candidate it asks for, once, and its outcome is stated against the sweep's best."""
import pytest

from caramel.errors import CaramelError
from caramel.tune.ledger import Measured, MeasuredTable, evaluate
from caramel.tune.search import model_guided, random_search, tpe_search
from caramel.tune.space import Knob, Space

SPACE = Space((Knob("bucket_cap_mb", (1, 2, 4), log=True), Knob("overlap", ("forward", "backward"))))
# step seconds and the steps each measurement cost (unequal, as settling differs per candidate)
VALUES = {(1, "forward"): (0.100, 10), (2, "forward"): (0.090, 11), (4, "forward"): (0.080, 12),
          (1, "backward"): (0.0815, 13), (2, "backward"): (0.120, 14), (4, "backward"): (0.130, 15)}


def table():
    return MeasuredTable(SPACE, {k: Measured(s, n) for k, (s, n) in VALUES.items()})


def cfg(cap, overlap):
    return {"bucket_cap_mb": cap, "overlap": overlap}


def test_first_query_is_charged_and_a_repeat_is_free():
    ledger = table().ledger(overhead_steps=5)
    assert ledger.steps_used == 5 and ledger.measurements == 0
    assert ledger.measure(cfg(2, "forward")) == 0.090
    assert ledger.measure(cfg(1, "backward")) == 0.0815
    assert ledger.measure(cfg(2, "forward")) == 0.090
    assert ledger.measurements == 2 and ledger.steps_used == 5 + 11 + 13
    assert [ledger.steps_after(n) for n in range(3)] == [5, 16, 29]


def test_sweep_totals_and_best():
    t = table()
    assert t.sweep_steps == 75
    assert t.best == (cfg(4, "forward"), Measured(0.080, 12))


def test_evaluate_counts_steps_until_within_tolerance():
    t = table()
    ledger = t.ledger(overhead_steps=3)
    for c in (cfg(1, "forward"), cfg(1, "backward"), cfg(4, "forward")):
        ledger.measure(c)
    out = evaluate("m", 0, ledger, t, tolerance=0.02)
    # 0.0815 is within 2% of 0.080 (1.875% off): reached at the second measurement
    assert out.steps_to_reach == 3 + 10 + 13 and out.steps_used == 3 + 10 + 13 + 12
    assert out.best_s == 0.080 and out.gap == 0.0 and out.measurements == 3
    strict = evaluate("m", 0, ledger, t, tolerance=0.01)
    assert strict.steps_to_reach == 3 + 10 + 13 + 12
    missed = t.ledger()
    missed.measure(cfg(2, "backward"))
    out = evaluate("m", 0, missed, t)
    assert out.steps_to_reach is None and out.gap == pytest.approx(0.5)


@pytest.mark.parametrize("method", ["model", "random", "tpe"])
def test_every_method_is_charged_for_what_it_measured(method):
    if method == "tpe":
        pytest.importorskip("optuna")
    t = table()
    ledger = t.ledger()
    if method == "model":
        result = model_guided(SPACE, lambda c: 0.1, ledger.measure, budget=3, seed=1)
    elif method == "random":
        result = random_search(SPACE, ledger.measure, budget=3, seed=1)
    else:
        result = tpe_search(SPACE, ledger.measure, budget=3, seed=1)
    keys = [SPACE.key(tr.config) for tr in result.trials]
    assert keys == ledger.order and len(set(keys)) == 3  # distinct measurements only, in order
    assert ledger.steps_used == sum(VALUES[k][1] for k in keys)
    assert [tr.measured_s for tr in result.trials] == [VALUES[k][0] for k in keys]


def test_bad_measurements_and_unknown_candidates_are_refused():
    with pytest.raises(CaramelError, match="positive number of seconds"):
        Measured(0.0, 3)
    with pytest.raises(CaramelError, match="whole number of steps"):
        Measured(0.1, 0)
    with pytest.raises(CaramelError, match="lacks 1 candidate"):
        MeasuredTable(SPACE, {k: Measured(s, n) for k, (s, n) in list(VALUES.items())[1:]})
    with pytest.raises(CaramelError, match="was not measured in the sweep"):
        table().ledger().measure(cfg(8, "forward"))
    with pytest.raises(CaramelError, match="measured nothing"):
        evaluate("random", 0, table().ledger(), table())


def test_summary_row_counts_targets_and_never_as_infinitely_many_steps():
    from caramel.commands.tune_report import summary_row
    from caramel.tune.ledger import Outcome

    outcomes = [Outcome("random", 0, 2, 20, 0.080, 0.0, 20),   # within 2%, 20 of 100 steps: met
                Outcome("random", 1, 3, 21, 0.0815, 0.01875, 21),  # within 2% but over a fifth: not met
                Outcome("random", 2, 2, 18, 0.090, 0.125, None)]  # never within 2%
    row = summary_row("random", outcomes, [20, 40, None], sweep_steps=100)
    assert row["within_2pct"] == 2 and row["target_met"] == 1 and row["runs"] == 3
    assert row["steps_used"] == 20 and row["steps_used_share"] == 0.2
    assert row["median_steps_to_2pct"] == 40 and row["steps_to_2pct"] == [20, 40, None]
    assert summary_row("random", outcomes, [None, None, 40], 100)["median_steps_to_2pct"] == float("inf")
