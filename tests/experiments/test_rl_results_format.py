"""The stored coflow and placement results (docs/results/rl/) carry the format tag their scripts
write (experiments/coflow_rl.py, experiments/edge_placement.py,
experiments/placement_focus_check.py), so a reader can tell them apart."""
from pathlib import Path

import pytest

from caramel.jsonio import read_json

RL = Path(__file__).resolve().parents[2] / "docs" / "results" / "rl"


@pytest.mark.parametrize("pattern, kind, experiment", [
    ("coflow_*.json", "coflow-rl", "coflow_rl"), ("edge_placement*.json", "edge-placement", "edge_placement"),
    ("placement_focus_check*.json", "placement-focus-check", "placement_focus_check")])
def test_every_stored_file_reads_as_its_kind(pattern, kind, experiment):
    paths = sorted(RL.glob(pattern))
    assert paths, pattern
    for path in paths:
        assert read_json(path, kind)["experiment"] == experiment, path.name
