"""A caramel run with a fixed compression mode (none, fp16, topk, powersgd), checkpointed after
3 of 6 steps and resumed in fresh processes, equals the run never stopped, losses and
parameters bit for bit: the resumed engine adopts the checkpoint's plan instead of profiling
and planning again (2-rank gloo, `plan_resume_workers`). A saved plan that torch DDP ran is
handed to torch DDP again; one made with other options is not adopted, and rank 0 says so."""
import pytest
import torch

from caramel.testing import run_workers
from tests.strategies.caramel.plan_resume_workers import MODES

torch.set_num_threads(1)


@pytest.mark.timeout(280)
def test_every_compression_mode_resumes_bit_for_bit(tmp_path):
    from tests.strategies.caramel.plan_resume_workers import full_worker, resumed_worker
    full = run_workers(full_worker, 2, args=(str(tmp_path),), timeout_s=130)
    resumed = run_workers(resumed_worker, 2, args=(str(tmp_path),), timeout_s=130)
    for rank in range(2):
        f, r = full[rank], resumed[rank]
        assert f["topk"]["codecs"] == ["topk:0.1"] and f["powersgd"]["codecs"] == ["powersgd:2"], f
        for mode in MODES:
            assert r[mode]["profiling_after_load"] is False, (mode, r[mode])
            assert r[mode]["plan"] == r[mode]["full_plan"], mode
            assert r[mode]["losses"] == r[mode]["full_losses"][3:], (mode, r[mode])
            assert r[mode]["same_params"], (mode, r[mode])
        assert r["ddp"] == {"delegating_after_load": True, "same_losses": True, "same_params": True}, r["ddp"]
        other = r["other_options"]
        assert other["profiling_after_load"] is True
        if rank == 0:
            assert "compression" in other["said"] and "topk:0.1" in other["said"] and "chosen again" in other["said"], other


def test_a_bad_or_newer_plan_entry_is_one_clear_error_and_an_auto_plan_fits_auto_only():
    from types import SimpleNamespace

    from caramel.errors import CaramelError
    from caramel.strategies.caramel.plan_state import _unfit, restore_plan

    c = SimpleNamespace(world=2, rank=0, fingerprint="f", plan_inputs={"compression": "topk:0.1"})
    with pytest.raises(CaramelError, match="'plan' must be a mapping, got list"):
        restore_plan(c, [])
    with pytest.raises(CaramelError, match="version 3, newer than this caramel reads"):
        restore_plan(c, {"version": 3})
    for version in (True, "2", None, 0):
        with pytest.raises(CaramelError, match=f"version {version!r}, expected an integer from 1 to 2"):
            restore_plan(c, {"version": version})
    base = {"version": 2, "plan": {}, "overlap": "forward", "profile": None, "cluster": None}
    with pytest.raises(CaramelError, match="malformed inputs"):
        restore_plan(c, {**base, "inputs": ["compression"]})
    with pytest.raises(CaramelError, match="malformed steps"):
        restore_plan(c, {**base, "steps": 3})
    with pytest.raises(CaramelError, match="lacks profile, cluster"):
        restore_plan(c, {"version": 2, "plan": {}, "overlap": "forward"})
    legacy = {"version": 1, "plan": {"world_size": 2, "model_fingerprint": "f"}}
    assert _unfit(c, legacy, legacy=True) == "it was made with compression='auto' (this run 'topk:0.1')"
    c.plan_inputs = {"compression": "auto"}
    assert _unfit(c, legacy, legacy=True) is None
    assert _unfit(c, {"plan": {"world_size": 4, "model_fingerprint": "f"}, "inputs": c.plan_inputs}, False) == \
        "it was made for 4 workers, this job has 2"
