"""`caramel train --data URL` end to end: 2 local workers training from a file:// store in the
global order, stopped mid-epoch and resumed with another (empty) cache directory, end with the
parameters of the in-memory run, bit for bit, and log the same losses at every step; a fresh
run empties the default cache (OUT_DIR/data-cache) that an earlier run left."""
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


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_fresh_run_empties_the_default_cache_and_keeps_a_given_one(tmp_path):
    """The locality order follows the cache, so a fresh run starts from an empty default cache
    (what an earlier run left there would change its batches); a --cache-dir is the user's."""
    store, out = tmp_path / "digits", tmp_path / "run"
    assert main(["data", "make", str(store), "--workload", "digits", "--samples-per-shard", "64"]) == 0
    stale = out / "data-cache" / "rank0" / "left-by-an-earlier-run"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    result, s = run_train(out, "--workload", "digits", "--workers", "1", "--steps", "2", "--batch-size", "64",
                          "--data", str(store), "--loader-workers", "0")
    check_ok(result)
    assert "emptied the shard cache" in result.stdout
    assert not stale.exists() and any(stale.parent.iterdir())  # emptied, then filled by this run

    from caramel.train.store_data import clear_default_cache
    from caramel.train.config import TrainConfig, apply_dict
    given = tmp_path / "mine" / "rank0" / "kept"
    given.parent.mkdir(parents=True)
    given.write_bytes(b"x")
    cfg = apply_dict(TrainConfig(), {"run": {"workload": "digits", "out_dir": str(out)},
                                     "data": {"url": str(store), "cache_dir": str(tmp_path / "mine")}}, "test")
    assert not clear_default_cache(cfg, 0) and given.exists()
