"""Typed strategy options: one parser, types checked per field, misspellings named."""
import dataclasses

import pytest

from caramel.errors import CaramelError
from caramel.strategies import STRATEGIES
from caramel.strategies.caramel.options import CaramelOptions, planner_knobs
from caramel.strategies.ddp.options import DdpOptions
from caramel.strategies.options import build_options, format_value, nearest, parse_spec, parse_value, to_spec


@pytest.mark.parametrize("text, value", [("true", True), ("False", False), ("3", 3), ("0.25", 0.25), ("1e-3", 1e-3),
                                         ("fifo", "fifo"), (" 5 ", 5)])
def test_parse_value_reads_bools_numbers_and_text(text, value):
    got = parse_value(text)
    assert got == value and type(got) is type(value)


def test_format_value_inverts_parse_value():
    for v in (True, False, 3, 0.25, "fifo"):
        assert parse_value(format_value(v)) == v


def test_parse_spec_splits_name_and_options():
    assert parse_spec("caramel:overlap=forward,trial_steps=3") == ("caramel", {"overlap": "forward", "trial_steps": 3})
    assert parse_spec("ddp") == ("ddp", {})


@pytest.mark.parametrize("text, message", [
    ("caramel:overlap", "is not key=value"), ("caramel:overlap=forward,overlap=none", "given twice"),
    (":overlap=forward", "expected NAME"), ("caramel:9x=1", "is not key=value"),
])
def test_parse_spec_names_syntax_errors(text, message):
    with pytest.raises(CaramelError, match=message):
        parse_spec(text)


def test_unknown_option_names_the_nearest_valid_one():
    with pytest.raises(CaramelError, match="unknown option 'overlpa'; did you mean 'overlap'\\?"):
        build_options(CaramelOptions, {"overlpa": "forward"})
    with pytest.raises(CaramelError, match="unknown option 'zzz'; expected one of"):
        build_options(CaramelOptions, {"zzz": 1})
    assert nearest("bucket_cap", ["bucket_cap_mb", "static_graph"]) == "bucket_cap_mb"


@pytest.mark.parametrize("values, message", [
    ({"trial_steps": "3"}, "trial_steps must be int"),
    ({"split_tied": 1}, "split_tied must be bool"),
    ({"trial_steps": True}, "trial_steps must be int"),
    ({"overlap": "sideways"}, "overlap must be one of auto, forward, backward, none"),
    ({"comm_priority": None}, "comm_priority must be one of"),
    ({"trial_steps": 1}, "trial_steps must be an integer >= 2"),
    ({"planner": "fifp"}, "did you mean 'fifo'"),
    ({"input_spread": 0.1, "planner": "fifo"}, "input_spread is for planner caramel, not 'fifo'"),
])
def test_bad_values_are_one_clear_error(values, message):
    with pytest.raises(CaramelError, match=message):
        build_options(CaramelOptions, values)


def test_ints_widen_to_floats_and_defaults_stay():
    opts = build_options(CaramelOptions, {"planner": "fifo", "bucket_cap_mb": 5})
    assert opts.bucket_cap_mb == 5.0 and isinstance(opts.bucket_cap_mb, float)
    assert opts.planner_options() == {"bucket_cap_mb": 5.0}
    assert build_options(CaramelOptions, {}) == CaramelOptions()


def test_planner_knobs_come_from_the_planners_signatures():
    assert planner_knobs("fifo") == {"bucket_cap_mb", "first_bucket_mb", "compute_schedule"}
    assert planner_knobs("fusion") == {"fusion_threshold_mb", "cycle_time_ms", "compute_schedule"}
    assert {"input_spread", "contention_spread", "collective_cpu_s", "comm_model", "compute_schedule"} <= planner_knobs("caramel")
    fields = {f.name for f in dataclasses.fields(CaramelOptions)}
    for planner in ("fifo", "fusion", "caramel"):
        assert planner_knobs(planner) <= fields, planner  # every planner knob can be set


def test_canonical_spelling_lists_only_changed_options_sorted():
    spec = STRATEGIES.spec("caramel:planner=fifo,overlap=forward", {"bucket_cap_mb": 5})
    assert spec.name == "caramel:bucket_cap_mb=5,overlap=forward,planner=fifo"
    assert to_spec("ddp", DdpOptions()) == "ddp"
    assert STRATEGIES.spec(spec.name).options == spec.options


def test_the_same_option_in_text_and_keyword_is_an_error():
    with pytest.raises(CaramelError, match="given both"):
        STRATEGIES.spec("caramel:overlap=forward", {"overlap": "backward"})


def test_unknown_strategy_names_the_nearest():
    with pytest.raises(CaramelError, match="unknown strategy 'dpp'; did you mean 'ddp'"):
        STRATEGIES.get("dpp")
    assert {"caramel", "ddp"} <= set(STRATEGIES.names())


@pytest.mark.parametrize("value", ["sometimes", -1, True, 1.5, None])
def test_compute_schedule_bad_values_are_one_clear_error(value):
    with pytest.raises(CaramelError, match="compute_schedule"):
        build_options(CaramelOptions, {"compute_schedule": value})


def test_compute_schedule_takes_auto_off_or_k_for_every_planner():
    assert CaramelOptions().compute_schedule == "auto" and CaramelOptions(compute_schedule="auto").planner_options() == {}
    assert build_options(CaramelOptions, {"compute_schedule": "off"}).planner_options() == {"compute_schedule": "off"}
    name, values = parse_spec("caramel:planner=fifo,compute_schedule=2")
    opts = build_options(CaramelOptions, values)
    assert opts.compute_schedule == 2 and opts.planner_options() == {"compute_schedule": 2}
    assert STRATEGIES.spec("caramel:compute_schedule=2").name == "caramel:compute_schedule=2"
    assert build_options(CaramelOptions, {"planner": "fusion", "compute_schedule": 0}).compute_schedule == 0


def test_a_value_may_hold_a_colon_but_not_options_joined_by_one():
    assert parse_spec("ps:consistency=ssp:2,order=tic") == ("ps", {"consistency": "ssp:2", "order": "tic"})
    with pytest.raises(CaramelError, match="holds a ':'; options are separated by commas"):
        parse_spec("caramel:planner=fifo:overlap=backward")
