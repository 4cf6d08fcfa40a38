"""Validation records and scoring (the runner is to come; the arithmetic is checked here by hand)."""
import pytest

from caramel.errors import FormatError
from caramel.stats import percentile
from experiments.validation.compare import ValidationConfig, ValidationRecord, ValidationReport, ranking_pairs, score

pytestmark = pytest.mark.timeout(30)


def _rec(planner, predicted, measured, workers=2, repeats=()):
    return ValidationRecord(ValidationConfig("mlp", workers, 1e8, 1e-4, planner, "forward"), predicted, list(measured),
                            list(repeats))


def test_error_and_spread():
    r = _rec("fifo", 1.1, [1.0, 0.9, 1.1])
    assert r.measured_median_s == 1.0
    assert r.error == pytest.approx(0.1)
    assert r.spread == pytest.approx(0.1)  # stdev 0.1 / mean 1.0
    assert _rec("fifo", 1.0, [1.0], repeats=[0.9, 1.0, 1.2]).spread == pytest.approx(0.3)


def test_percentile():
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([0, 10], 90) == pytest.approx(9.0)


def test_ranking_pairs_and_ties():
    recs = [_rec("fifo", 2.0, [2.0, 2.0]), _rec("fusion", 1.5, [1.8, 1.8]), _rec("caramel", 1.6, [1.0, 1.0]),
            _rec("ddp", 1.0, [1.0, 1.0], workers=4)]  # other setting: not paired
    # fifo>fusion agree, fifo>caramel agree, fusion vs caramel: predicted 1.5<1.6, measured 1.8>1.0: disagree
    assert ranking_pairs(recs) == {"agree": 2, "disagree": 1, "measured_ties": 0}
    noisy = [_rec("fifo", 1.0, [1.0, 1.2, 0.8]), _rec("caramel", 1.1, [1.05, 1.05])]
    assert ranking_pairs(noisy) == {"agree": 0, "disagree": 0, "measured_ties": 1}


def test_score_and_targets():
    recs = [_rec("fifo", 1.02, [1.0, 1.0]), _rec("caramel", 0.5, [0.5, 0.5]), _rec("fusion", 0.9, [1.0, 1.0], workers=4)]
    s = score(recs)
    assert s["median_abs_error"] == pytest.approx(0.02)
    assert s["p90_abs_error"] == pytest.approx(0.02 + (0.1 - 0.02) * 0.8)
    assert s["ranking"]["agreement"] == 1.0
    assert s["targets_met"] == {"median_abs_error": True, "p90_abs_error": False, "ranking": True}
    with pytest.raises(FormatError):
        score([])


def test_report_round_trip_and_table(tmp_path):
    rep = ValidationReport([_rec("fifo", 1.02, [1.0, 1.0]), _rec("caramel", 0.5, [0.5, 0.6])], meta={"host": "x"})
    rep.save(tmp_path / "v.json")
    back = ValidationReport.load(tmp_path / "v.json")
    assert back.to_dict() == rep.to_dict()
    table = rep.markdown()
    assert "| mlp | 2 | 100 Mbit/s | fifo/forward | 1020.0 | 1000.0 | +2.0% |" in table
    assert "2 configurations" in table


def test_bad_report():
    with pytest.raises(FormatError, match=r"records\[0\]"):
        ValidationReport.from_dict({"format": "caramel.validation/1", "records": [{"config": {}}]})
    good = ValidationReport([_rec("fifo", 1.0, [1.0])]).to_dict()
    good["records"][0]["measured_step_times_s"] = []
    with pytest.raises(FormatError, match="measured_step_times_s"):
        ValidationReport.from_dict(good)
