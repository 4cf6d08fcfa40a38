"""experiments/balance_thaw_variants.py: every variant runs and is stored, the shipped thaw is put
back afterwards, and the shipped controller follows the lasting changes to the ideal shares."""
import json
import sys

import caramel.strategies.caramel.balance as balance
import experiments.balance_thaw_variants as variants


def test_variants_run_and_the_shipped_thaw_is_restored(tmp_path, monkeypatch):
    monkeypatch.setattr(variants, "SEEDS", range(1))
    out = tmp_path / "thaw.json"
    monkeypatch.setattr(sys, "argv", ["balance_thaw_variants", "--json", str(out)])
    shipped = balance.THAW_DECISIONS
    variants.main()
    assert balance.THAW_DECISIONS == shipped
    data = json.loads(out.read_text())
    assert data["format"] == "caramel.balance-thaw-variants/1" and len(data["rows"]) == 5
    row = next(r for r in data["rows"] if r["variant"] == f"thaw at {shipped} in a row, 20-step windows")
    assert [x["final_excess_pct"] < 1.0 for x in row["lasting"]] == [True] * 4, row["lasting"]
