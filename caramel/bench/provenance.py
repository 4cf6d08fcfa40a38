"""Which code made a benchmark run: the Caramel checkout's commit, written into the results.

Saved prediction inputs are replayed against later simulators
(`experiments/predict_saved_inputs.py`); without the run's commit a replay cannot tell a
runtime that made a transfer from one that did not (GPT-2's tied weight, docs/pipeline.md).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import caramel


def package_root() -> Path:
    """The directory holding the `caramel` package (the checkout's root for an editable install)."""
    return Path(caramel.__file__).resolve().parent.parent


def code_version(root: Path | None = None) -> str:
    """`<commit>` of the checkout at `root` (12 hex digits, `-dirty` when tracked files differ
    from it), or `caramel <version>` where `root` is not the top of a git checkout (an installed
    package, or git missing): a site-packages inside some other repository is not that repository."""
    root = (root or package_root()).resolve()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if top and Path(top).resolve() == root else None
    if not commit:
        return f"caramel {caramel.__version__}"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return commit[:12] + ("-dirty" if dirty else "")
