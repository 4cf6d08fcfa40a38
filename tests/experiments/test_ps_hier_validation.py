"""experiments/ps_hier_validation.py: the hierarchical row against flat ps and ddp, paired by round."""
import pytest


def test_the_speedup_is_median_over_median_with_the_paired_rounds_interval():
    from experiments.ps_hier_validation import speedup

    rows = {"ps": {"step_time_median_s": 0.6, "round_medians_s": [0.6, 0.62, 0.58]},
            "ps:hierarchical=true": {"step_time_median_s": 0.3, "round_medians_s": [0.3, 0.31, 0.29]}}
    sp = speedup(rows, "ps", "ps:hierarchical=true")
    assert sp["point"] == pytest.approx(2.0) and sp["rounds"] == 3
    assert sp["interval_95"] == pytest.approx([2.0, 2.0])  # every round's ratio is exactly 2
    rows["ps:hierarchical=true"]["round_medians_s"] = [0.3, 0.4, 0.25]
    lo, hi = speedup(rows, "ps", "ps:hierarchical=true")["interval_95"]
    assert lo < 2.0 < hi
    assert speedup(rows, "ddp", "ps:hierarchical=true") is None  # a row the run did not measure
    rows["ps"]["round_medians_s"] = [0.6, 0.62]
    assert speedup(rows, "ps", "ps:hierarchical=true")["interval_95"] is None  # under 3 paired rounds
    rows["ps"]["round_medians_s"] = [0.6, 0.62, 0.58, 0.61]  # one round more than the other row
    rows["ps:hierarchical=true"]["round_medians_s"] = [0.3, 0.31, 0.29]
    assert speedup(rows, "ps", "ps:hierarchical=true")["rounds"] == 3  # the rounds the interval pairs


def test_e_is_a_number_only_inside_its_range_and_with_bounds_apart():
    """E = (U - m) / (U - L): at S 0.07 it divides by noise, outside [0, 1] the bounds do not
    describe the step; both are reported as words, with (m - U) / L = -E S beside them."""
    from experiments.ps_hier_validation import tac_reading

    ok = tac_reading({"E_median": 0.77, "S": 0.64, "beyond_U_over_L_median": -0.5})
    assert ok == {"E": 0.77, "E_not_meaningful": None, "beyond_U_over_L": -0.5, "beyond_U_over_L_exact": True}
    flat = tac_reading({"E_median": -18.35, "S": 0.069})
    assert flat["E"] is None and flat["E_not_meaningful"] == "n/a (S 0.07 < 0.2)"
    assert flat["beyond_U_over_L"] == pytest.approx(18.35 * 0.069) and not flat["beyond_U_over_L_exact"]
    for E in (2.22, -0.18):
        out = tac_reading({"E_median": E, "S": 0.5})
        assert out["E"] is None and out["E_not_meaningful"] == f"out of bounds ({E:.2f})"
    assert tac_reading({"E_median": 0.0, "S": 0.2})["E"] == 0.0 and tac_reading({"E_median": 1.0, "S": 3})["E"] == 1.0
    assert tac_reading({"E_median": None, "S": None})["E_not_meaningful"] == "not measured"


def test_a_configuration_without_records_is_named(tmp_path):
    import json

    from experiments.ps_hier_validation import analyse

    run = tmp_path / "failed.json"
    run.write_text(json.dumps({"meta": {"prediction_inputs": {"resnet18() x4 @ 100mbit, 2 hosts of 2": {}}},
                               "records": []}))
    with pytest.raises(SystemExit, match=r"failed.json \[resnet18\(\) x4 @ 100mbit, 2 hosts of 2\]: prediction inputs "
                                          "but no records"):
        analyse(str(run))
