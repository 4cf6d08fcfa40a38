"""Bad input on the command line, for every subcommand: exit code 2, one error line on stderr
that names the input, no traceback, and no change to the host (namespaces, links, files)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from caramel.cluster import netns

REPO = Path(__file__).resolve().parents[2]
CARAMEL = [str(REPO / ".venv" / "bin" / "caramel")] if (REPO / ".venv" / "bin" / "caramel").exists() \
    else [sys.executable, "-m", "caramel.cli"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "truncated.json").write_text('{"format": "caramel.profile/1", "params": [')
    (d / "trace-truncated.json").write_text('{"format": "caramel.trace/1", "events": [{"rank": 0')
    (d / "plan-as-profile.json").write_text('{"format": "caramel.plan/1", "buckets": []}')
    (d / "bad.toml").write_text("[run]\nsteps = 'many'\n")
    (d / "broken.toml").write_text("[run\nsteps = 3\n")
    (d / "unknown.toml").write_text("[run]\nstepz = 3\n")
    (d / "binary.json").write_bytes(b"\x80\x81\xfe")
    return d


# (argv, words the error line must contain); "{d}" is the temporary directory
CASES = [
    (["train", "--workload", "imagenet"], ["--workload", "imagenet"]),
    (["train", "--steps", "many"], ["--steps", "many"]),
    (["train", "--steps", "0"], ["--steps", ">= 1"]),
    (["train", "--lr", "-1"], ["--lr"]),
    (["train", "--config", "{d}/missing.toml"], ["missing.toml", "no such file"]),
    (["train", "--config", "{d}/bad.toml"], ["run.steps", "integer"]),
    (["train", "--config", "{d}/broken.toml"], ["broken.toml", "TOML"]),
    (["train", "--config", "{d}/unknown.toml"], ["stepz"]),
    (["train", "--cluster", "on", "--bandwidth", "fast"], ["bandwidth", "fast"]),
    (["train", "--resume", "{d}/no-such-ckpt"], ["no-such-ckpt"]),
    (["train", "--script", "{d}/missing.py"], ["missing.py"]),
    (["bench", "--model", "no_such_model"], ["no_such_model"]),
    (["bench", "--bandwidth", "fast"], ["fast"]),
    (["bench", "--workers", "0"], ["workers"]),
    (["profile", "--model", "no_such_model"], ["no_such_model"]),
    (["profile"], ["--model"]),
    (["plan", "--profile", "{d}/missing.json"], ["missing.json"]),
    (["plan", "--profile", "{d}/truncated.json"], ["truncated.json"]),
    (["plan", "--profile", "{d}/plan-as-profile.json"], ["plan-as-profile.json", "profile"]),
    (["plan", "--profile", "{d}/binary.json"], ["binary.json"]),
    (["plan", "--synthetic", "no_such_model"], ["no_such_model"]),
    (["plan", "--synthetic", "chain4", "--planner", "no_such_planner"], ["no_such_planner"]),
    (["plan", "--synthetic", "chain4", "--bandwidth", "fast"], ["fast"]),
    (["simulate", "--profile", "{d}/truncated.json"], ["truncated.json"]),
    (["simulate", "--synthetic", "chain4", "--bandwidth=-5mbit"], ["-5mbit"]),
    (["simulate", "--synthetic", "chain4", "--workers", "zero"], ["--workers"]),
    (["cluster", "run", "--workers", "2", "--bandwidth", "fast", "--", "true"], ["fast"]),
    (["cluster", "run", "--workers", "0", "--", "true"], ["workers"]),
    (["cluster", "probe", "--workers", "2", "--bandwidth", "1parsec"], ["1parsec"]),
    (["cluster", "explode"], ["explode"]),
    (["trace", "summary", "{d}/missing.json"], ["missing.json"]),
    (["trace", "summary", "{d}/trace-truncated.json"], ["trace-truncated.json"]),
    (["trace", "summary", "{d}/plan-as-profile.json"], ["plan-as-profile.json"]),
    (["no-such-command"], ["no-such-command"]),
]


_OTHER_CLUSTERS = re.compile(r"crm[0-9a-f]{6}")  # other engineers' emulated clusters come and go meanwhile


def _host() -> dict:
    if not netns.support().ok:
        return {}
    return {"netns": sorted(n for n in netns.list_netns() if not _OTHER_CLUSTERS.match(n)),
            "links": sorted(n for n in netns.list_links() if not _OTHER_CLUSTERS.match(n))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv,words", CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_bad_input_exits_2_with_one_line_naming_it(files, argv, words, tmp_path):
    argv = [a.replace("{d}", str(files)) for a in argv]
    before = _host()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([*CARAMEL, *argv], capture_output=True, text=True, timeout=100, env=env, cwd=tmp_path)
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\nstderr:\n{err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, f"expected one error line, got:\n{err}"
    # argparse mistakes also print the usage line before it (argparse's convention); nothing else may appear
    others = [line for line in err.splitlines() if line.strip() and "error:" not in line and not line.startswith(("usage:", " "))]
    assert others == [], err
    for w in words:
        assert w in errors[0], f"{errors[0]!r} does not name {w!r}"
    assert list(tmp_path.iterdir()) == [], "a failed command left files behind"
    assert _host() == before, "a failed command changed the host's namespaces or links"
