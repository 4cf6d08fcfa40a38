"""experiments/pipeline_sharing_cycles.py: the unsettled ends are counted per kind of options,
refused layouts apart, over the same seeded cases."""
import random
from types import SimpleNamespace

import pytest

from caramel.errors import CaramelError


def _script():
    from experiments import pipeline_sharing_cycles
    return pipeline_sharing_cycles


def test_unsettled_and_refused_simulations_are_counted_per_kind(monkeypatch):
    script = _script()

    def fake(prof, spec, opts):
        if opts.replicas == "auto":
            return SimpleNamespace(meta={"sharing": {"settled": spec.world_size != 3, "passes": 10}})
        if opts.stages > len(prof.params):
            raise CaramelError(f"{opts.stages} stages, {len(prof.params)} layers")
        return SimpleNamespace(meta={"sharing": {"settled": True, "passes": 2}})

    monkeypatch.setattr(script, "simulate_pipeline", fake)
    got = script.count(40, seed=3)["kinds"]
    rng = random.Random(3)  # the cases count() draws
    cases = [script.random_case(rng) for _ in range(40)]
    threes = [i for i, (_, spec, _) in enumerate(cases) if spec.world_size == 3]
    deep = [i for i, (prof, _, opts) in enumerate(cases)
            if opts["partition=auto, given counts"].stages > len(prof.params)]
    assert threes and deep  # the seed draws both
    auto, given = got["replicas=auto"], got["partition=auto, given counts"]
    assert (auto["simulations"], auto["unsettled"], auto["unsettled_cases"], auto["max_passes"]) == (40, len(threes), threes, 10)
    assert (auto["refused"], auto["refused_cases"]) == (0, [])
    assert (given["simulations"], given["refused"], given["unsettled"]) == (40 - len(deep), len(deep), 0)
    assert given["refused_cases"] == [{"case": i, "error": "4 stages, 3 layers"} for i in deep]


def test_a_refusal_other_than_too_many_stages_stops_the_count(monkeypatch):
    script = _script()

    def fake(prof, spec, opts):
        raise CaramelError("a regression")

    monkeypatch.setattr(script, "simulate_pipeline", fake)
    with pytest.raises(CaramelError, match="a regression"):
        script.count(5, seed=3)


def test_the_real_simulations_settle_or_not_and_count_every_case():
    """A smoke test on the real simulator: each case is simulated or refused once per kind, and
    the pass counts are within the cap; whether a case settles is what the script measures, so it
    is not asserted here."""
    got = _script().count(2, seed=0)
    for k in got["kinds"].values():
        assert k["simulations"] + k["refused"] == 2 and 1 <= k["max_passes"] <= 10
        assert all("stages need at least" in r["error"] for r in k["refused_cases"])


def test_the_json_is_tagged_and_the_stored_counts_are_those_the_docs_quote(monkeypatch, tmp_path):
    """--json writes a `caramel.pipeline-sharing-cycles/1` file; the stored ones read back with
    the counts of docs/results/pipeline-sharing-cycles.md."""
    from pathlib import Path

    from caramel.jsonio import read_json
    script = _script()
    monkeypatch.setattr(script, "simulate_pipeline",
                        lambda prof, spec, opts: SimpleNamespace(meta={"sharing": {"settled": True, "passes": 1}}))
    out = tmp_path / "cycles.json"
    assert script.main(["--cases", "3", "--json", str(out)]) == 0
    written = read_json(out, "pipeline-sharing-cycles")
    assert (written["cases"], written["kinds"]["replicas=auto"]["simulations"]) == (3, 3)
    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    quoted = {"pipeline-sharing-cycles.json": (0, 0), "pipeline-sharing-cycles-c08e454.json": (6, 1)}
    for name, (auto, given) in quoted.items():
        kinds = read_json(results / name, "pipeline-sharing-cycles")["kinds"]
        assert (kinds["replicas=auto"]["unsettled"], kinds["partition=auto, given counts"]["unsettled"]) == (auto, given)
        assert (kinds["replicas=auto"]["simulations"], kinds["partition=auto, given counts"]["simulations"]) == (1000, 963)
