"""The package's layering holds: pyproject.toml's import-linter contracts, checked on every run.

Tools (cli, commands, bench, train, cluster) sit over the strategies, which compose the library
(runtime, sim, trace, plan, profile, topology); the runtime never imports the simulator, the
simulator never imports the runtime, and nothing in `caramel` imports `experiments`.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(cwd: Path, config: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter")
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-c", LINT, "--config", str(config), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept():
    proc = _lint(ROOT, ROOT / "pyproject.toml", ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_a_forbidden_import_breaks_a_contract(tmp_path):
    """The check can fail: the runtime contract over a tree whose runtime imports the simulator."""
    pkg = tmp_path / "caramel"
    for sub in ("runtime", "sim"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "engine.py").write_text("import caramel.sim\n")
    config = tmp_path / "contracts.ini"
    config.write_text("[importlinter]\nroot_package = caramel\n\n[importlinter:contract:runtime]\nname = runtime\n"
                      "type = forbidden\nsource_modules = caramel.runtime\nforbidden_modules = caramel.sim\n")
    proc = _lint(tmp_path, config, tmp_path)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout, proc.stdout + proc.stderr
