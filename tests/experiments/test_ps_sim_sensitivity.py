"""experiments/ps_sim_sensitivity.py replays every ps row from its recorded inputs only when that
replay is the run's own prediction, and names the row that is not."""
import json
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / "docs/results/ps_sim_4workers_run1/bench.json"


def test_the_recorded_inputs_reproduce_the_recorded_predictions_and_a_mismatch_is_named(tmp_path, capsys):
    from experiments.ps_sim_sensitivity import main, replay_mismatches

    d = json.loads(RUN.read_text())
    assert replay_mismatches(d) == []
    ps = [r for r in d["records"] if r["strategy"] == "ps:order=tic"]
    assert len(ps) == 1
    ps[0]["prediction_error"] += 0.01
    (bad,) = replay_mismatches(d)
    assert "ps:order=tic" in bad and "x4" in bad
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(d))
    assert main([str(path)]) == 1
    assert "ps:order=tic" in capsys.readouterr().err
