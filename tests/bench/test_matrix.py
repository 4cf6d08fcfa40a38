"""Strategy names, configurations and the shipped matrices."""
import pytest

from caramel.bench.matrix import (DEFAULT_MATRIX, DEFAULT_STRATEGIES, QUICK_MATRIX, BenchConfig, BenchSettings,
                                  parse_strategies, parse_strategy)
from caramel.errors import CaramelError


def test_strategy_names_are_canonical():
    s = parse_strategy("caramel:overlap=backward,planner=fifo")
    assert s.kind == "caramel" and s.option_dict() == {"planner": "fifo", "overlap": "backward"}
    assert s.name == "caramel:overlap=backward,planner=fifo"
    assert parse_strategy("ddp").name == "ddp"
    assert parse_strategy("ddp:bucket_cap_mb=50").option_dict() == {"bucket_cap_mb": 50.0}
    assert parse_strategy("caramel:planner=caramel,input_spread=0").option_dict()["input_spread"] == 0
    with pytest.raises(CaramelError, match="unknown option 'max_chunks'"):  # never passed through unchecked
        parse_strategy("caramel:max_chunks=4")
    with pytest.raises(CaramelError, match="did you mean 'bucket_cap_mb'"):
        parse_strategy("ddp:bucket_cap=50")
    assert parse_strategy("ddp:comm_priority=realtime").option_dict() == {"comm_priority": "realtime"}
    assert parse_strategy("caramel:comm_priority=normal").name == "caramel:comm_priority=normal"


def test_strategy_list_keeps_variant_options_together():
    names = [s.name for s in parse_strategies("ddp,caramel,caramel:planner=fifo,overlap=backward")]
    assert names == ["ddp", "caramel", "caramel:overlap=backward,planner=fifo"]


@pytest.mark.parametrize("bad", ["fast", "ddp:planner=fifo", "caramel:overlap=sideways", "caramel:planner",
                                 "caramel:=x", "ddp:bucket_cap_mb=-1", "ddp:bucket_cap_mb=big", "ddp,,caramel", "ddp,ddp",
                                 "ddp:comm_priority=high", "caramel:comm_priority=1"])
def test_bad_strategies_are_user_errors(bad):
    with pytest.raises(CaramelError):
        parse_strategies(bad)


def test_unknown_planner_is_caught_before_any_job_runs():
    # `:` instead of `,` between options made the planner "fifo:overlap=backward"; it used to
    # fail inside every worker after the cluster was up
    with pytest.raises(CaramelError, match="planner='fifo:overlap=backward' holds a ':'; options are separated by commas"):
        parse_strategies("ddp,caramel:planner=fifo:overlap=backward")
    with pytest.raises(CaramelError, match="unknown planner 'fast'"):
        parse_strategies("caramel:planner=fast")


def test_config_validation():
    c = BenchConfig("resnet18", workers=2, bandwidth="0.3gbit")
    assert c.bandwidth == "300mbit" and c.bandwidth_bps == 300e6
    for bad in (dict(workers=0, bandwidth="1gbit"), dict(workers=2, bandwidth="fast"),
                dict(workers=2, bandwidth=None, batch_size=0)):
        with pytest.raises(CaramelError):
            BenchConfig("mlp", **bad)
    with pytest.raises(CaramelError):
        BenchSettings(rounds=0)


def test_default_matrix_is_defined_by_ratios_not_rates():
    two = [c for c in DEFAULT_MATRIX if c.workers == 2 and c.model == "resnet18"]
    assert sorted(c.comm_ratio for c in two) == [0.5, 1.0, 2.0]
    assert [c.regime for c in sorted(two, key=lambda c: c.comm_ratio)] == ["compute-bound", "balanced", "comm-bound"]
    assert any(c.model == "gpt2" and 1.0 <= c.comm_ratio <= 2.0 for c in DEFAULT_MATRIX)
    assert any(c.workers == 4 and c.comm_ratio == 1.0 for c in DEFAULT_MATRIX)
    for c in DEFAULT_MATRIX + QUICK_MATRIX:
        assert c.bandwidth is None and c.needs_rate and c.rate_source is None, c
    assert {c.regime for c in QUICK_MATRIX} == {"compute-bound", "comm-bound"}
    assert BenchConfig.from_dict(DEFAULT_MATRIX[0].to_dict()) == DEFAULT_MATRIX[0]
    assert "ddp" in DEFAULT_STRATEGIES and "ddp:comm_priority=realtime" in DEFAULT_STRATEGIES


def test_a_point_gets_its_rate_and_keeps_its_meaning():
    point = BenchConfig("resnet18", workers=2, comm_ratio=1)
    assert point.label == "resnet18() x2 @ comm/compute 1" and point.regime == "balanced"
    run = point.with_rate("612mbit", 0.031)
    assert run.bandwidth == "612mbit" and run.comm_ratio == 1.0 and run.rate_source == "derived" and not run.needs_rate
    assert run.label == "resnet18() x2 @ 612mbit" and point.bandwidth is None
    assert BenchConfig.from_dict(run.to_dict()) == run
    assert BenchConfig("resnet18", workers=2, bandwidth="1gbit").rate_source == "pinned"
    assert point.workload_key == BenchConfig("resnet18", workers=2, comm_ratio=2).workload_key
    for bad in (dict(workers=2, comm_ratio=0), dict(workers=2, comm_ratio=-1.0), dict(workers=2, comm_ratio=float("nan")),
                dict(workers=1, comm_ratio=1.0), dict(workers=2, comm_ratio="1")):
        with pytest.raises(CaramelError):
            BenchConfig("mlp", **bad)


def test_dedicated_ps_servers_are_refused_before_any_job_runs():
    with pytest.raises(CaramelError, match="does not run dedicated ps servers yet"):
        parse_strategies("ddp,ps:servers=1,dedicated=true")
