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
