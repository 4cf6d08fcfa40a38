"""`caramel train --data URL` end to end, 2 local workers: training from a file:// store in the
global order, stopped mid-epoch and resumed with another (empty) cache directory, ends with the
parameters of the in-memory run, bit for bit, and logs the same losses at every step."""
from __future__ import annotations

import pytest
import torch

from caramel.cli import main
from tests.train.test_runs import RUN_TIMEOUT_S, check_ok, run_train, train_losses

# 1617 digits, 2 x 64 per step -> 12 steps per epoch: step 14 is mid-way through the second epoch
ARGS = ["--workload", "digits", "--workers", "2", "--batch-size", "64", "--steps", "16", "--checkpoint-every", "0",
        "--warmup-steps", "2", "--lr", "0.01"]


def final_model(out) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoints" / "ckpt-000000016" / "state.pt", weights_only=True)["model"]


@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)
def test_store_run_stopped_and_resumed_matches_the_in_memory_run(tmp_path, capsys):
    store = tmp_path / "digits"
    assert main(["data", "make", str(store), "--workload", "digits"]) == 0
    assert "digits training split, 1617 samples" in capsys.readouterr().out
    memory, out = tmp_path / "memory", tmp_path / "store"
    check_ok(run_train(memory, *ARGS)[0])
    data = ["--data", f"file://{store}", "--data-order", "global", "--loader-workers", "1"]
    result, s = run_train(out, *ARGS, *data, "--cache-dir", str(tmp_path / "cache-a"), "--stop-after-steps", "14")
    check_ok(result)
    assert s["end_step"] == 14 and s["data_store"]["url"] == f"file://{store}"
    assert "train 1617 from file://" in result.stdout
    result, s = run_train(out, *ARGS, *data, "--cache-dir", str(tmp_path / "cache-b"), "--resume", "auto")
    check_ok(result)
    assert s["start_step"] == 14 and s["finished"]
    assert train_losses(out) == train_losses(memory)  # exact float equality, every step
    mine, theirs = final_model(out), final_model(memory)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert any((tmp_path / "cache-b" / "rank1").iterdir())  # the resumed run read through its shard cache
