"""End-to-end `caramel train` runs: 2 local workers (torchrun --standalone, gloo on CPU).

Small models and few steps; each run is a subprocess in its own session with a timeout, and
the whole process group is killed if it overruns, so nothing can hang or outlive the test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240

# digits: 1617 training images, 2 x 32 per step -> 25 steps per epoch, so 30 steps cross an epoch.
DIGITS = ["--workload", "digits", "--workers", "2", "--batch-size", "32", "--steps", "30", "--checkpoint-every", "15",
          "--warmup-steps", "3", "--lr", "0.01", "--log-every-steps", "5"]


def run_train(out: Path, *args: str, env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.update(env_extra or {})
    summary_path = out.parent / f"{out.name}-summary.json"
    # Our options go first: everything after `--` in `args` belongs to a --script.
    # plain local workers: as root, --cluster auto would use the emulated cluster
    ours = ["--out-dir", str(out), "--cluster", "off"] + ([] if "--script" in args else ["--json", str(summary_path)])
    argv = [sys.executable, "-m", "caramel.cli", "train", *ours, *args]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"caramel train {' '.join(args)} did not finish in {RUN_TIMEOUT_S} s")
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return result, summary


def train_losses(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["kind"] == "train"]


def check_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def digits_baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "run"
    result, summary = run_train(out, *DIGITS)
    check_ok(result)
    return out, summary


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_digits_two_workers_learn(digits_baseline):
    out, s = digits_baseline
    assert s["world_size"] == 2 and s["strategy"] == "caramel" and s["finished"]
    assert s["final_loss"] < s["first_loss"] - 1.0  # from ln(10) = 2.30 at the start
    assert s["val_accuracy"] > 0.7 and s["val_predictions"] == 180  # chance is 0.1; every validation image counted once
    assert "remainder dropped" in s["data"]
    assert [step for step, _ in train_losses(out)] == list(range(1, 31))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["ckpt-000000015", "ckpt-000000030"]
    assert s["format"] == "caramel.train-summary/1"  # the --json copy of OUT_DIR/summary.json


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 30)
def test_stop_and_resume_gives_the_same_losses_bit_for_bit(digits_baseline, tmp_path):
    base_out, _ = digits_baseline
    out = tmp_path / "run"
    result, s = run_train(out, *DIGITS, "--stop-after-steps", "15")
    check_ok(result)
    assert not s["finished"] and s["end_step"] == 15
    result, s = run_train(out, *DIGITS, "--resume", "auto")
    check_ok(result)
    assert s["start_step"] == 15 and s["resumed_from"].endswith("ckpt-000000015") and s["finished"]
    assert train_losses(out) == train_losses(base_out)  # exact float equality, every step


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_torchrun_restart_resumes_from_the_last_checkpoint(digits_baseline, tmp_path):
    base_out, _ = digits_baseline
    out = tmp_path / "run"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # rank 1 dies after step 20 (5 steps past the step-15 checkpoint); torchrun restarts both workers.
    result, s = run_train(out, *DIGITS, "--max-restarts", "1",
                          env_extra={"CARAMEL_TRAIN_CRASH_AT_STEP": "20:1", "TMPDIR": str(tmp)})
    check_ok(result)
    assert "exiting at step 20" in result.stdout + result.stderr
    assert s["start_step"] == 15 and s["finished"]
    assert train_losses(out) == train_losses(base_out)
    # torchrun's logs of both attempts went to a directory the launcher removed (torch's compile
    # cache, torchinductor_<user>, is torch's own to keep)
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == []


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_char_gpt_two_workers_learn(tmp_path):
    out = tmp_path / "run"
    result, s = run_train(out, "--workload", "char_gpt", "--workers", "2", "--steps", "40", "--d-model", "32", "--layers", "1",
                          "--heads", "2", "--seq-len", "32", "--text-bytes", "100000", "--batch-size", "8", "--lr", "0.01",
                          "--warmup-steps", "5", "--checkpoint-every", "0")
    check_ok(result)
    assert s["world_size"] == 2 and s["strategy"] == "caramel"
    assert s["final_loss"] < s["first_loss"] - 1.5  # ln(256) = 5.55 at the start
    assert s["val_loss"] < s["first_loss"] - 1.5 and s["val_accuracy"] > 0.1
    assert (out / "trace.rank0.json").exists() and (out / "trace.rank1.json").exists()
    assert s["trace"].endswith("trace.merged.json") and {e["rank"] for e in json.loads(Path(s["trace"]).read_text())["events"]} == {0, 1}


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_user_script_runs_on_two_workers(tmp_path):
    result, _ = run_train(tmp_path / "run", "--script", "examples/train_script.py", "--workers", "2", "--", "--steps", "30")
    check_ok(result)
    line = next(l for l in result.stdout.splitlines() if "train_script:" in l)
    assert "2 workers, 30 steps" in line
    first, last = (float(v) for v in line.split("loss ")[1].split(",")[0].split(" -> "))
    assert last < first


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_dataset_smaller_than_a_global_batch_is_one_clear_error(tmp_path):
    result, _ = run_train(tmp_path / "run", "--workload", "digits", "--workers", "1", "--batch-size", "5000")
    assert result.returncode == 2
    assert "fewer than one global batch" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_corrupt_checkpoint_is_refused_before_workers_start(digits_baseline, tmp_path):
    base_out, _ = digits_baseline
    bad = tmp_path / "ckpt-000000015"
    bad.mkdir()
    for f in (base_out / "checkpoints" / "ckpt-000000015").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "state.pt").write_bytes((bad / "state.pt").read_bytes()[:-100])
    result, _ = run_train(tmp_path / "run", *DIGITS, "--resume", str(bad))
    assert result.returncode == 2
    assert "state.pt is corrupt" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_balanced_batches_give_a_slowed_worker_fewer_samples(tmp_path):
    out = tmp_path / "run"
    result, s = run_train(out, "--workload", "digits", "--workers", "2", "--batch-size", "32", "--steps", "20",
                          "--strategy", "caramel:balance=batch", "--slow-worker", "1:3", "--log-every-steps", "5")
    check_ok(result)
    slow = s["slow_worker"]
    assert slow["rank"] == 1 and slow["delay_per_sample_s"] > 0
    assert len(slow["compute_per_sample_per_rank_s"]) == 2 and slow["compute_per_sample_per_rank_s"][1] == slow["compute_per_sample_s"]  # every rank's
    first, last = s["share_changes"][0][1], s["share_counts"]
    assert first == [32, 32] and sum(last) == 64 and last[0] > last[1], s["share_changes"]  # rank 1 is 3x slower
    assert s["val_predictions"] == 180 and s["final_loss"] < s["first_loss"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(90)
def test_sigterm_to_the_launcher_leaves_no_worker_and_no_log_dir(tmp_path):
    """The launcher gets SIGTERM while two workers (sessions of their own under torchrun) run a
    script that sleeps: it exits 143, neither torchrun nor a worker survives, and torchrun's log
    dir is removed."""
    from caramel.train.workers import _children

    script = tmp_path / "sleep.py"
    script.write_text("import os, pathlib, time\n"
                      f"pathlib.Path({str(tmp_path)!r}, 'ready.' + os.environ['RANK']).write_text(str(os.getpid()))\n"
                      "time.sleep(120)\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    argv = [sys.executable, "-m", "caramel.cli", "train", "--out-dir", str(tmp_path / "run"), "--cluster", "off",
            "--script", str(script), "--workers", "2"]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    spawned: list[int] = []  # torchrun and the workers, each a session leader
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        spawned = [pid for pid, _ in _children(proc.pid)] + [int((tmp_path / f"ready.{r}").read_text()) for r in (0, 1)]
        assert len(spawned) == 3 and list(tmp.glob("caramel-torchrun-*"))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 143, stderr[-3000:]
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in spawned) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in spawned if _alive(p)], "processes outlived the launcher"
        assert not list(tmp.glob("caramel-torchrun-*"))
    finally:
        for pid in [proc.pid] + spawned:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.communicate()
