"""experiments/predict_again.py: the old simulator it loads from git leaves no file behind."""
import subprocess
import tempfile
from pathlib import Path

import pytest

from experiments import predict_again

REPO = Path(__file__).resolve().parents[2]


def test_old_simulator_loads_and_leaves_nothing_in_the_temp_dir(tmp_path, monkeypatch):
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("needs a git checkout")
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() caches its first answer
    simulate = predict_again.old_simulator("HEAD", "ps")
    assert callable(simulate) and simulate.__name__ == "simulate_ps"
    assert list(tmp_path.iterdir()) == []
