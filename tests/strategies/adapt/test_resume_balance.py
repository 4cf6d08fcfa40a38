"""A run with balance="dropout" or "batch", or compression="auto", stopped at N/2 and resumed
from its checkpoint in fresh objects equals the run never stopped: the balancer's state (steps,
fractions or shares, the confirmation, every rank's window), auto's plan, and the parameters,
bit for bit (2-rank gloo; the balancers' clock is faked, `resume_workers`, so every decision is
deterministic)."""
import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies.caramel.balance_state import load_balancer_state
from caramel.testing import run_workers
from tests.strategies.adapt.test_dropout import _table

torch.set_num_threads(1)


@pytest.mark.timeout(120)
def test_resumed_dropout_batch_and_auto_runs_keep_their_decisions_and_parameters(tmp_path):
    from tests.strategies.adapt.resume_workers import resume_worker
    for res in run_workers(resume_worker, 2, args=(_table(tmp_path / "t.json"),), timeout_s=110):
        # dropout, decisions every 2 steps, the profiling steps (1-5) untimed: proposed at step 6,
        # saved at 7, confirmed at 8 (a resumed confirmation that restarted would wait for step
        # 10, with other masks)
        full, resumed = res["dropout"]["full"], res["dropout"]["resumed"]
        assert resumed["start"] == 7 and full["fractions"] == [0.0, 0.5], full
        assert full["changes"][0]["step"] == 8, full["changes"]
        assert resumed == {**full, "start": 7}
        assert res["dropout"]["same_params"]
        # batch: rank 1 3x slower per sample; the profiling steps (1-5) untimed: shares changed
        # at step 6, saved at 7, fitted cost (two batch sizes timed) by step 8
        full, resumed = res["batch"]["full"], res["batch"]["resumed"]
        assert resumed["start"] == 7 and full["schedule"]["entries"][1] == [6, [12, 4]], full
        assert full["fixed_s"] is not None and len(full["times"]) == 2, full
        assert resumed == {**full, "start": 7}
        assert res["batch"]["same_params"]
        # compression="auto" on a 1 Mbit/s link: fp16 on some bucket; the resumed engine runs
        # the saved plan at once (no uncompressed profiling steps), to the same parameters
        full, resumed = res["auto"]["full"], res["auto"]["resumed"]
        assert "fp16" in full["codecs"] and full["plan"] == full["plan_at_save"] and full["replans"] == 1, full
        assert resumed["profiling_after_load"] is False and resumed["plan"] == full["plan"]
        assert full.pop("older_checkpoint_profiles") is True  # without the entry: loads, profiles as before
        assert resumed["codecs"] == full["codecs"] and resumed["replans"] == 0
        assert res["auto"]["same_params"]


class _Stub:
    """The least a balancer state is read from (`load_balancer_state` checks before it restores)."""

    confirmation = None


def test_a_newer_version_or_another_mode_or_world_is_one_clear_error():
    good = {"version": 1, "kind": "dropout", "world": 2, "shared": {}, "ranks": {}}
    with pytest.raises(CaramelError, match="version 2 is newer than this caramel reads"):
        load_balancer_state(_Stub(), {**good, "version": 2}, 0, 2)
    with pytest.raises(CaramelError, match="balance='batch' state, this run has balance='dropout'"):
        load_balancer_state(_Stub(), {**good, "kind": "batch"}, 0, 2)
    with pytest.raises(CaramelError, match="for 4 ranks, this job has 2"):
        load_balancer_state(_Stub(), {**good, "world": 4}, 0, 2)
