"""The scripts behind docs/data.md's calibration-window and knee sections, on stored records:
what they read and the numbers the page quotes from them."""
import json
from pathlib import Path

import pytest

from caramel.data.format import write_random_dataset

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # the runs' data set: caramel data make /tmp/dm/store --samples 512 --sample-bytes 16kb --samples-per-shard 16
    root = tmp_path_factory.mktemp("dm")
    return root, write_random_dataset(root, 512, 16_000, 16)


@pytest.fixture(scope="module")
def window_runs():
    return json.loads((RESULTS / "data-bench-window.json").read_text())["runs"]


def test_a_stored_window_is_summed_up_again_from_its_steps(window_runs):
    from caramel.bench.calibration_window import window_summary
    from experiments.data_calibration_window import resummarised, window_of

    old, new = window_runs["old-1"]["record"], window_runs["new-1"]["record"]
    assert (window_of(old, "locality"), window_of(new, "locality")) == (40, 160)
    cal = new["rows"][0]["calibrations"][0]["loaded"]
    assert len(cal["steps_s"]) == 158 and cal["sub_windows"] == 4
    assert cal["step_s"] == pytest.approx(window_summary(cal["steps_s"], 4))  # what the run used
    again = resummarised(new, lambda xs: window_summary(xs, 1))["rows"][0]["calibrations"][0]["loaded"]
    assert again["step_s"] == pytest.approx(cal["step_s_mean"]) and cal["step_s"] != again["step_s"]
    assert new["rows"][0]["calibrations"][0]["loaded"]["step_s"] == cal["step_s"]  # a copy: the record is kept


def test_the_window_runs_give_the_spread_ratio_the_docs_quote(store, window_runs, tmp_path, capsys):
    from experiments.data_calibration_window import main, sd_ratio_interval

    ratio, lo, hi = sd_ratio_interval([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0])
    assert ratio == pytest.approx(2.0) and lo < 2.0 < hi
    root, _ = store
    pairs = {k: v for k, v in window_runs.items() if k.split("-")[1] in ("1", "2", "3")}
    (tmp_path / "runs.json").write_text(json.dumps({"format": "caramel.data-bench-runs/1", "runs": pairs}))
    assert main([str(root), str(tmp_path / "runs.json")]) == 0
    out = capsys.readouterr().out
    assert "window 40 steps: 3 runs" in out and "window 160 steps: 3 runs" in out
    # the numbers of these three pairs, computed once from the stored steps (the page quotes all 14)
    arm = out.split("window 160 steps")
    lines = {(steps, ln.split()[0]): ln for steps, part in zip((40, 160), arm) for ln in part.splitlines()
             if ln.startswith("  ")}
    assert "error mean -8.4% sd 8.5% range -18.3%..-3.4%, within 15% 2 of 3" in lines[(40, "median:8")]
    assert "error mean -5.9% sd 11.4% range -13.1%..+7.2%" in lines[(160, "median:8")]
    assert "error mean +2.6% sd 20.0% range -10.0%..+25.7%" in lines[(160, "first:38")]
    assert "the prediction's cv 10.8%" in lines[(160, "first:38")]
    assert ("calibrations' step 7.46, wait 1.44, all-reduce 1.85 (9 calibrations); the mode's steady step "
            "7.63, wait 1.59, all-reduce 1.91, past each epoch's first two steps 7.45") in lines[(40, "bias,")]
    assert "past each epoch's first two steps 7.44" in lines[(160, "bias,")]
    ratios = [ln for ln in out.splitlines() if ln.startswith("sd of the errors")]
    assert ratios[0] == "sd of the errors, 160 steps (recorded) over 40 steps (mean): 2.22 (95% 0.35-13.83)"
    assert ratios[3] == "sd of the errors, 160 steps (median:8) over 40 steps (median:8): 1.33 (95% 0.21-8.30)"


def test_the_restart_runs_show_the_100mbit_link_nearly_full_in_steady_steps(store):
    from caramel.bench.data_report import stored_records_of
    from experiments.data_knee import steady_link_share, within_run_slopes

    root, index = store
    files = sorted(str(p) for p in RESULTS.glob("data-bench-restart-*-[0-9].json"))
    records = dict(stored_records_of(files))
    shares = {Path(w).stem: steady_link_share(r, index) for w, r in records.items() if "f200" not in w}
    delivered = {k: link / step for k, (step, link, _) in shares.items()}
    assert min(delivered.values()) == pytest.approx(0.954, abs=5e-4)
    assert max(delivered.values()) == pytest.approx(0.978, abs=5e-4)
    modelled = [link / model for step, link, model in shares.values()]
    assert (min(modelled), max(modelled)) == (pytest.approx(0.879, abs=5e-4), pytest.approx(0.939, abs=5e-4))
    slopes = within_run_slopes({w: r for w, r in records.items() if "half" in w}, index)
    ((rounds, measured, model),) = slopes.values()
    assert rounds == 12 and measured < 1.0 < 3.0 < model  # the round's step does not follow its read; the model does
