"""Checkpoints: exact round trip with weights_only, atomic writes, pruning, and refusals."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from caramel.errors import CaramelError
from caramel.train import checkpoint as ckpt
from caramel.train.config import TrainConfig

pytestmark = pytest.mark.timeout(60)


def make_state(step: int, model: torch.nn.Module, cfg: TrainConfig, world: int = 2) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return {"step": step, "epoch": 0, "index": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": {"last_epoch": step}, "rng": [ckpt.rng_state()] * world, "config": cfg.to_dict()}


def test_rng_states_round_trip_exactly():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal()  # leaves a cached gaussian in numpy's state
    saved = ckpt.rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random(), np.random.normal())
    torch.rand(5), np.random.rand(5), random.random()
    ckpt.set_rng_state(saved)
    got = (torch.rand(3), np.random.rand(3), random.random(), np.random.normal())
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1]) and expected[2:] == got[2:]


def test_save_load_round_trip_and_prune(tmp_path):
    torch.manual_seed(0)
    model, cfg = torch.nn.Linear(4, 3), TrainConfig()
    for step in (5, 10, 15):
        path = ckpt.save(tmp_path, step, make_state(step, model, cfg), world_size=2, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10, 15]
    assert not list(tmp_path.glob(".tmp-*"))  # nothing half-written left behind
    state = ckpt.load(path)
    assert state["step"] == 15 and torch.equal(state["model"]["weight"], model.weight.detach())
    assert torch.load(path / ckpt.STATE_FILE, weights_only=True)["step"] == 15
    ckpt.check_compatible(state, cfg.to_dict(), 2, model, str(path))


def test_corrupt_checkpoint_is_refused_and_auto_skips_it(tmp_path):
    model, cfg = torch.nn.Linear(4, 3), TrainConfig()
    ckpt.save(tmp_path, 1, make_state(1, model, cfg), 2, keep_last=5)
    newest = ckpt.save(tmp_path, 2, make_state(2, model, cfg), 2, keep_last=5)
    data = bytearray((newest / ckpt.STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / ckpt.STATE_FILE).write_bytes(bytes(data))
    with pytest.raises(CaramelError, match="state.pt is corrupt"):
        ckpt.load(newest)
    path, state = ckpt.latest_valid(tmp_path)
    assert state["step"] == 1 and path.name == "ckpt-000000001"


def test_truncated_and_missing_files(tmp_path):
    model, cfg = torch.nn.Linear(4, 3), TrainConfig()
    path = ckpt.save(tmp_path, 3, make_state(3, model, cfg), 2, keep_last=5)
    (path / ckpt.META_FILE).write_text('{"format": "caramel.checkpoint/1", "st')
    with pytest.raises(CaramelError, match="not valid JSON"):
        ckpt.load(path)
    (path / ckpt.META_FILE).unlink()
    with pytest.raises(CaramelError, match="no such file"):
        ckpt.load(path)
    with pytest.raises(CaramelError, match="not a directory"):
        ckpt.load(tmp_path / "ckpt-000000099")
    assert ckpt.latest_valid(tmp_path) is None


def test_mismatches_are_refused_before_loading(tmp_path):
    model, cfg = torch.nn.Linear(4, 3), TrainConfig()
    state = ckpt.load(ckpt.save(tmp_path, 3, make_state(3, model, cfg), 2, keep_last=5))
    other = TrainConfig()
    other.optim.lr = 1.0
    with pytest.raises(CaramelError, match=r"optim.lr = 0.003 in the checkpoint, 1.0 now"):
        ckpt.check_compatible(state, other.to_dict(), 2, model, "ck")
    with pytest.raises(CaramelError, match="written by 2 workers; this run has 3"):
        ckpt.check_compatible(state, cfg.to_dict(), 3, model, "ck")
    with pytest.raises(CaramelError, match="model entry 'weight' is \\(3, 4\\), the model has \\(5, 4\\)"):
        ckpt.check_compatible(state, cfg.to_dict(), 2, torch.nn.Linear(4, 5), "ck")
    with pytest.raises(CaramelError, match="model entries differ"):
        ckpt.check_compatible(state, cfg.to_dict(), 2, torch.nn.Linear(4, 3, bias=False), "ck")
    allowed = TrainConfig()
    allowed.checkpoint.every_steps, allowed.run.stop_after_steps = 7, 9  # these may change across a resume
    ckpt.check_compatible(state, allowed.to_dict(), 2, model, "ck")


def test_resaving_a_step_replaces_it_whole(tmp_path):
    model, cfg = torch.nn.Linear(4, 3), TrainConfig()
    ckpt.save(tmp_path, 4, make_state(4, model, cfg), 2, keep_last=5)
    with torch.no_grad():
        model.weight.fill_(7.0)
    path = ckpt.save(tmp_path, 4, make_state(4, model, cfg), 2, keep_last=5)
    assert len(ckpt.list_checkpoints(tmp_path)) == 1
    assert not list(tmp_path.glob(".old-*"))
    assert torch.equal(ckpt.load(path)["model"]["weight"], model.weight.detach())
