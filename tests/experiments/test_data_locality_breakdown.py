"""The locality rows' error split into parts: hand-computed rows, the parts sum to the error,
rows without a loaded calibration are left out, and the other ranks' parts only where kept."""
import json
from pathlib import Path

import pytest

from experiments.data_locality_breakdown import breakdown, family, main


def _row(**kw):
    cal = [{"loaded": {"step_s": s, "wait_s": w, "sync_s": y, "compute_s": 4e-3}}
           for s, w, y in [(6e-3, 1e-3, 1e-3), (7e-3, 1.5e-3, 1.5e-3), (9e-3, 2e-3, 2.5e-3)]]
    return dict(dict(step_s_steady=8e-3, wait_s_steady=2e-3, sync_s_steady=2e-3, calibrations=cal,
                     hit_rate_steady=1.0, remote_bytes_per_epoch_steady=0.0,
                     tiers_per_epoch_steady={"memory_hits": 256.0, "disk_hits": 0.0}), **kw)


def test_the_parts_are_the_hand_computed_ones_and_sum_to_the_error():
    b = breakdown(_row(), predicted_s=7.2e-3)
    t = b["terms_s"]
    # median 7, mean 22/3 ms; calibrations' wait 1.5, all-reduce 5/3, rest (4 + 4 + 4.5) / 3 ms
    assert t["model_terms"] == pytest.approx(0.2e-3)
    assert t["aggregation"] == pytest.approx(7e-3 - 22e-3 / 3)
    assert t["wait"] == pytest.approx(-0.5e-3)
    assert t["all_reduce"] == pytest.approx(5e-3 / 3 - 2e-3)
    assert t["rest"] == pytest.approx(12.5e-3 / 3 - 4e-3)  # the mode's rest: 8 - 2 - 2 = 4 ms
    assert sum(t.values()) == pytest.approx(b["error_s"]) and b["error_s"] == pytest.approx(-0.8e-3)
    assert sum(b["shares"].values()) == pytest.approx(b["error"]) and b["error"] == pytest.approx(-0.1)
    assert b["other_ranks"] is None and b["measured"]["steps_past_start_s"] is None


def test_a_windowed_calibrations_rest_is_its_mean_step_less_its_mean_parts():
    """A calibration whose step is a window's median keeps its mean (`step_s_mean`): the rest
    compares means with means, and the median's gap goes to the aggregation alone."""
    row = _row()
    for c, mean_s in zip(row["calibrations"], (6.5e-3, 7.5e-3, 9.5e-3)):
        c["loaded"]["step_s_mean"] = mean_s
    t = breakdown(row, predicted_s=7.2e-3)["terms_s"]
    # mean step 23.5/3 ms; its rest that less the mean wait 1.5 and all-reduce 5/3 ms, the mode's 4 ms
    assert t["aggregation"] == pytest.approx(7e-3 - 23.5e-3 / 3)
    assert t["rest"] == pytest.approx(23.5e-3 / 3 - 1.5e-3 - 5e-3 / 3 - 4e-3)
    assert t["model_terms"] == pytest.approx(0.2e-3) and sum(t.values()) == pytest.approx(-0.8e-3)


def test_no_loaded_calibration_no_breakdown_and_steps_past_each_epochs_start():
    assert breakdown(_row(calibrations=[{"loaded": None}]), 7e-3) is None
    # 1 round of 3 epochs: the first fills the cache and is left out; each kept epoch less its first two steps
    row = _row(calibrations=_row()["calibrations"][:1],
               epoch_step_s=[[50e-3, 9e-3, 9e-3], [20e-3, 10e-3, 7e-3, 9e-3], [20e-3, 10e-3, 8e-3]])
    assert breakdown(row, 7e-3)["measured"]["steps_past_start_s"] == pytest.approx(8e-3)


def test_the_other_ranks_parts_where_the_record_keeps_them():
    row = _row(wait_s_steady_ranks=[2e-3, 3e-3], sync_s_steady_ranks=[2e-3, 0.5e-3])
    for c in row["calibrations"]:
        c["other_ranks"] = [{"rank": 1, "loaded": {"step_s": 7e-3, "wait_s": 2e-3, "compute_s": 4e-3, "sync_s": 1e-3}}]
    (other,) = breakdown(row, 7.2e-3)["other_ranks"]
    assert other["rank"] == 1 and other["wait"] == pytest.approx(-1e-3) and other["all_reduce"] == pytest.approx(0.5e-3)
    row["calibrations"][0].pop("other_ranks")  # a calibration without them: not half a comparison
    assert breakdown(row, 7.2e-3)["other_ranks"] is None


def test_families_and_a_missing_output_are_named(capsys):
    assert family("docs/results/data-bench-restart-full-2.json") == "restart"
    assert family("docs/results/data-bench-window.json:old-10") == "window-old"
    assert family("x/data-bench-calibration.json:ce09310/full3") == "data-bench-calibration.json"
    assert main(["store", "--json"]) == 2
    assert "OUT_JSON" in capsys.readouterr().err


def test_the_ranks_fields_do_not_move_the_model_on_a_fresh_record(tmp_path):
    """The /7 fields (every rank's wait and all-reduce) are not model inputs: a fresh record
    replays to the bit with them stripped, as the records before them do."""
    import copy

    from caramel.data.format import write_random_dataset
    from caramel.data.store import Store
    from experiments.data_model_repredict import repredict

    write_random_dataset(tmp_path, 512, 16_000, 16)  # the runs' data set (caramel data make ... 16kb)
    index = Store(str(tmp_path)).index()
    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "data-bench-locality-fresh.json"
    record = json.loads(path.read_text())["runs"]["f100-2"]["record"]
    stripped = copy.deepcopy(record)
    for row in stripped["rows"]:
        row.pop("wait_s_steady_ranks"), row.pop("sync_s_steady_ranks")
        for c in row["calibrations"]:
            c.pop("other_ranks")
    assert repredict(stripped, index) == repredict(record, index)
    (row,) = record["rows"]
    assert repredict(record, index)[0]["repredicted_s"] == row["predicted_step_s"]  # what the run printed


def _strict(text):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_main_scores_the_fresh_runs_file_and_writes_strict_json(tmp_path):
    """main() on the stored fresh runs: the rule's verdict and its correlations as docs/data.md
    gives them; a file of one run (no correlation defined) is written with null, not NaN."""
    from caramel.data.format import write_random_dataset

    store = tmp_path / "store"
    write_random_dataset(store, 512, 16_000, 16)  # the runs' data set (caramel data make ... 16kb)
    runs = Path(__file__).resolve().parents[2] / "docs" / "results" / "data-bench-locality-fresh.json"
    out = tmp_path / "breakdown.json"
    assert main([str(store), str(out), str(runs)]) == 0
    rank1 = _strict(out.read_text())["overall"]["full_cache_other_ranks"]
    assert rank1["rows"] == 16 and rank1["rule_other_ranks_wait_met"] is True
    assert rank1["r_rank0_all_reduce_rank1_wait"] == pytest.approx(0.54, abs=0.005)
    assert rank1["r_rank0_all_reduce_rank1_all_reduce"] == pytest.approx(0.95, abs=0.005)
    one = tmp_path / "one-run.json"
    document = json.loads(runs.read_text())
    one.write_text(json.dumps(dict(document, runs={"f100-2": document["runs"]["f100-2"]})))
    assert main([str(store), str(out), str(one)]) == 0
    rank1 = _strict(out.read_text())["overall"]["full_cache_other_ranks"]
    assert rank1["rows"] == 1 and rank1["r_rank0_all_reduce_rank1_wait"] is None
    assert "rule_other_ranks_wait_met" not in rank1
