"""Fuzzing the file parsers, unit parsers and the train config loader: only CaramelError
(a ValueError subclass) may escape, never another exception type.

Each parser gets documents that start valid and have one field replaced by a random JSON value
or deleted, random JSON values, and files cut short or with a flipped byte. Runs are
derandomized (the same examples every run), so a failure is reproducible.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caramel.topology.spec import ClusterSpec
from caramel.errors import CaramelError
from caramel.jsonio import read_json
from caramel.plan.plan import Plan
from caramel.strategies.planners import make_plan
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo
from caramel.trace.events import Trace, TraceEvent
from caramel.train import config as train_config
from caramel.units import parse_duration_s, parse_rate_bps, parse_size_bytes
from tests.reliability.fuzzing import damaged_text, mutated

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def only_caramel_error(fn, *args):
    """Call fn; a CaramelError is fine, any other exception fails the test with its type."""
    try:
        fn(*args)
    except CaramelError:
        pass


def _profile() -> ModelProfile:
    params = [ParamInfo(0, "a.weight", [4, 3], "float32", 12, 48, True, 1, 0.002, 0, 0.0, ["a"]),
              ParamInfo(1, "a.bias", [4], "float32", 4, 16, True, 0, 0.001, 0, 0.0, ["a"])]
    return ModelProfile("tiny", 8, 0.01, 0.02, 0.001, params, [ModuleInfo("a", "Linear", 0.0, 0.01, 0.02, [0, 1])])


PROFILE = _profile().to_dict()
PLAN = make_plan("fifo", _profile(), world_size=2).to_dict()
CLUSTER = ClusterSpec.uniform(2, 1e9).to_dict()
TRACE = Trace("measured", 2, [TraceEvent(0, "compute", "forward", "forward", 1.0, 0.5, 0),
                              TraceEvent(1, "comm", "comm", "allreduce:b0c0", 1.2, 0.1, 0, 0, 0, 64)]).to_dict()
PARSERS = {
    "profile": (ModelProfile.from_dict, PROFILE),
    "plan": (Plan.from_dict, PLAN),
    "cluster": (ClusterSpec.from_dict, CLUSTER),
    "trace": (Trace.from_dict, TRACE),
}


def test_the_valid_documents_parse():
    for name, (parse, doc) in PARSERS.items():
        parse(json.loads(json.dumps(doc)))  # a control: the fuzz tests start from documents that are fine


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_from_dict_on_mutated_documents_raises_only_caramel_error(kind):
    parse, doc = PARSERS[kind]
    @FUZZ
    @given(mutated(doc))
    def check(data):
        only_caramel_error(parse, data)
    check()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_read_json_on_damaged_files_raises_only_caramel_error(kind):
    _, doc = PARSERS[kind]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"x.{kind}.json"

        @FUZZ
        @given(damaged_text(doc))
        def check(blob):
            path.write_bytes(blob)
            only_caramel_error(read_json, path, kind)
        check()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_load_on_damaged_files_raises_only_caramel_error(kind):
    parse, doc = PARSERS[kind]
    loader = {"profile": ModelProfile.load, "plan": Plan.load, "cluster": ClusterSpec.load, "trace": Trace.load}[kind]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"x.{kind}.json"

        @FUZZ
        @given(damaged_text(doc))
        def check(blob):
            path.write_bytes(blob)
            only_caramel_error(loader, path)
        check()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("parse", [parse_rate_bps, parse_size_bytes, parse_duration_s])
def test_unit_parsers_raise_only_caramel_error(parse):
    @FUZZ
    @given(st.text(max_size=20) | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**30, 10**30)
           | st.from_regex(r"[-+]?[0-9]{0,400}\.?[0-9]{0,5}(e[-+]?[0-9]{1,4})?\s*[a-zA-Z]{0,5}", fullmatch=True))
    def check(text):
        only_caramel_error(parse, text)
    check()


def test_unit_parsers_accept_what_they_document():
    assert parse_rate_bps("100mbit") == 100e6 and parse_rate_bps("1gbps") == 8e9
    assert parse_size_bytes("25mb") == 25_000_000 and parse_size_bytes("4MiB") == 4 * 1024**2
    assert parse_duration_s("500ms") == 0.5 and parse_duration_s(3) == 3.0


TRAIN_DOC = {section: dict(values) for section, values in train_config.TrainConfig().to_dict().items()}


@pytest.mark.timeout(300)
def test_train_config_apply_dict_raises_only_caramel_error():
    @FUZZ
    @given(mutated(TRAIN_DOC))
    def check(data):
        only_caramel_error(train_config.apply_dict, train_config.TrainConfig(), data, "fuzz")
    check()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_train_config_files_raise_only_caramel_error(suffix):
    toml_text = "\n".join(f"[{s}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in vals.items())
                          for s, vals in TRAIN_DOC.items()).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"run{suffix}"

        @FUZZ
        @given(st.binary(max_size=300) | st.integers(0, len(toml_text)).map(lambda n: toml_text[:n])
               | (damaged_text(train_config.TrainConfig().to_json()) if suffix == ".json" else st.binary(max_size=10)))
        def check(blob):
            path.write_bytes(blob)
            only_caramel_error(train_config.load_file, path)
        check()
