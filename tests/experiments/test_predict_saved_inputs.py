"""experiments/predict_saved_inputs.py: inputs saved with a layout replay the hierarchical ps rows."""
import json
from pathlib import Path

from experiments import predict_saved_inputs

RUN = Path(__file__).resolve().parents[2] / "docs" / "results" / "ps_sim_4workers_run1"
HIER = "ps:hierarchical=true"


def _layout_run(tmp_path: Path, layout):
    """A copy of a stored 4-worker run whose ps row ran hierarchical, its inputs saved anew by the
    bench's own writer with `layout` (None: as a run of one rank per host saves them)."""
    from caramel.bench.harness import save_prediction_inputs
    from caramel.bench.hetero_prediction import Heterogeneity
    from caramel.profile.model_profile import ModelProfile

    tmp_path.mkdir(exist_ok=True)
    bench = json.loads((RUN / "bench.json").read_text())
    bench["records"] = [{**r, "strategy": HIER} for r in bench["records"] if r["strategy"] == "ps"]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (src,) = RUN.glob("trace/*/prediction_inputs.json")
    d = json.loads(src.read_text())
    out = tmp_path / "trace" / src.parent.name
    out.mkdir(parents=True)
    save_prediction_inputs(out / "prediction_inputs.json", ModelProfile.from_dict(d["profile"]), d["world"],
                           d["grad_bytes"], d["comm_s"], d["comm_buckets"], d["rank_compute_s"], d["spans"],
                           d["probed"], Heterogeneity.from_dict(d.get("heterogeneity")), d["traffic"],
                           {HIER: HIER}, d["config"], layout)
    return str(tmp_path)


def test_a_saved_layout_is_replayed_and_its_absence_is_named(tmp_path):
    layout = {"workers_per_node": 2, "backend": "gloo", "node_bandwidth_bps": 8e9}
    (row,) = predict_saved_inputs.predict_run(_layout_run(tmp_path / "with", layout))
    assert row["strategy"] == HIER and row["not_replayable"] is None
    assert row["predicted_s"] is not None and row["predicted_s"] > 0, row
    # without the layout the hierarchical model has no ranks per host: named, not predicted
    (row,) = predict_saved_inputs.predict_run(_layout_run(tmp_path / "without", None))
    assert row["not_replayable"] == "hierarchical, and the inputs lack the layout" and row["predicted_s"] is None


def test_predict_picks_passes_the_saved_layout(tmp_path, capsys):
    from experiments import predict_picks

    run = _layout_run(tmp_path, {"workers_per_node": 2, "backend": "gloo", "node_bandwidth_bps": 8e9})
    assert predict_picks.main([run, HIER]) == 0
    out = capsys.readouterr().out
    assert f"{HIER}: " in out and "not predicted" not in out, out
