"""experiments/ps_ssp_terms.py: its in-memory simulator copy must replay the recorded
prediction to the bit (the instrumentation changes nothing), and its early-apply switch must
change the ssp:2 row only (a what-if that moved bsp, or did nothing, would be a broken edit)."""
from __future__ import annotations

import copy
import json
import os

import pytest

from experiments import ps_ssp_terms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BENCH = os.path.join(ROOT, "docs", "results", "ps_ssp_steady_block", "bench.json")


def _inputs(strategy: str):
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies import STRATEGIES
    from caramel.topology.spec import ClusterSpec
    with open(BENCH) as f:
        d = json.load(f)
    (pi,) = d["meta"]["prediction_inputs"].values()
    (rec,) = [r for r in d["records"] if r["strategy"] == strategy]
    return (ModelProfile.from_dict(pi["profile"]), ClusterSpec.from_dict(copy.deepcopy(pi["clusters"]["base"])),
            STRATEGIES.spec(strategy).options, rec["predicted_step_s"])


def test_copy_replays_the_recorded_predictions_and_early_apply_moves_ssp_only():
    model, early = ps_ssp_terms.load_simulator(False), ps_ssp_terms.load_simulator(True)
    for strategy, entry in (("ps", 1), ("ps:consistency=ssp:2", 3)):
        prof, cluster, options, recorded_s = _inputs(strategy)
        base = ps_ssp_terms.replay(model, prof, cluster, options, entry, 8)
        what_if = ps_ssp_terms.replay(early, prof, cluster, options, entry, 8)
        assert base["steady_s"] == pytest.approx(recorded_s, rel=1e-12)
        assert base["steady_s"] == max(base["period_s"], base["group_s"])
        assert len(base["block_s"]) == 8
        if strategy == "ps":
            assert what_if["steady_s"] == base["steady_s"]
        else:
            assert what_if["steady_s"] < base["steady_s"]


def test_a_changed_simulator_source_stops_the_replay(monkeypatch):
    monkeypatch.setattr(ps_ssp_terms, "TERMS_EDIT", ("no such line in the source", "x"))
    with pytest.raises(SystemExit, match="source changed"):
        ps_ssp_terms.load_simulator(False)
