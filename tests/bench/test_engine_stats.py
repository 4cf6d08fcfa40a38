"""caramel.bench.strategies.engine_stats: what a bench record gets from the caramel engine, with
balance="dropout" the drops in force at the end and when each began (docs/results/adapt-sim.md
reads `dropout_changes` to say when the slow worker's drop started)."""
from types import SimpleNamespace


def _engine(balancer):
    return SimpleNamespace(stats_dict=lambda: {"steps": 40}, controller=SimpleNamespace(balancer=balancer))


def test_dropout_fractions_and_changes_are_recorded_as_copies():
    from caramel.bench.strategies import engine_stats

    change = {"step": 20, "fractions": [0.0, 0.5], "previous": [0.0, 0.0]}
    balancer = SimpleNamespace(fractions=[0.0, 0.5], changes=[change])
    out = engine_stats(_engine(balancer))
    assert out["steps"] == 40
    assert out["dropout_fractions"] == [0.0, 0.5]
    assert out["dropout_changes"] == [change] and all("step" in c for c in out["dropout_changes"])
    balancer.changes.append({"step": 30})
    change["step"] = 99
    assert out["dropout_changes"] == [{"step": 20, "fractions": [0.0, 0.5], "previous": [0.0, 0.0]}]


def test_no_dropout_keys_without_a_dropout_balancer():
    from caramel.bench.strategies import engine_stats

    for balancer in (None, SimpleNamespace(shares=[64, 64])):  # balance="off" / "batch"
        out = engine_stats(_engine(balancer))
        assert out == {"steps": 40}
