import subprocess

from caramel import __version__
from caramel.bench.provenance import code_version


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_a_checkout_gives_its_commit_and_says_when_tracked_files_differ(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert code_version(tmp_path) == head.strip()[:12]
    (tmp_path / "b.py").write_text("untracked\n")  # untracked files do not make the code differ
    assert code_version(tmp_path) == head.strip()[:12]
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == head.strip()[:12] + "-dirty"


def test_a_directory_inside_another_checkout_is_not_that_checkout(tmp_path):
    _git(tmp_path, "init", "-q")
    inner = tmp_path / "venv" / "site-packages"
    inner.mkdir(parents=True)
    assert code_version(inner) == f"caramel {__version__}"
    assert code_version(tmp_path / "venv") == f"caramel {__version__}"
