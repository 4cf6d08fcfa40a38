"""experiments/adapt_sim_replay.py refuses a bench file whose records could come from several
configurations, naming the file and its configurations."""
import json

import pytest


def test_a_file_with_several_configurations_is_refused_by_name(tmp_path):
    from experiments.adapt_sim_replay import replay

    path = tmp_path / "two.json"
    path.write_text(json.dumps({"meta": {"prediction_inputs": {"mlp a": {}, "mlp b": {}}}, "records": []}))
    with pytest.raises(SystemExit, match=r"two\.json: expected a bench file with one configuration, "
                                         r"found 2: 'mlp a', 'mlp b'"):
        replay(path)
