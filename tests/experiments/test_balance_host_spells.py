"""experiments/balance_host_spells.py: the spell rule on a made-up series, and the stored model
(docs/results/adapt-balance-host-spells.json, which the virtual clock's host noise draws from)
is what the script computes from run 9's stored records."""
from __future__ import annotations

import json
from pathlib import Path

from caramel.jsonio import read_json
from experiments.balance_host_spells import SOURCE_KIND, characterize, spells_of

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_a_spell_is_five_steps_off_the_line_on_one_side():
    calm = [0.02, -0.03, 0.01, -0.01, 0.03, -0.02, 0.0, 0.02]
    series = calm + [0.25, 0.3, 0.22, 0.28, 0.26, 0.24] + calm + [0.5] + calm + [-0.2, -0.15, -0.18, -0.2] + calm
    found = spells_of(series)
    assert [(i, n) for i, n, _ in found] == [(8, 6)], found  # the lone spike and the 4-step dip are no spells
    assert 0.24 <= found[0][2] <= 0.28


def test_stored_model_is_what_the_script_computes_from_run_9():
    stored = json.loads((RESULTS / "adapt-balance-host-spells.json").read_text())
    out = characterize(read_json(RESULTS / stored["source"], SOURCE_KIND))
    assert out["model"] == stored["model"]
    assert out["summary"]["spells"] == 89 and out["summary"]["trial_passes_count"] == {1: 7, 2: 4, 3: 8, 4: 1}
