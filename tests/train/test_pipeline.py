"""`caramel train --strategy pipeline:...`: the training loop on two stages (2 processes, gloo).

The loop runs in spawned workers (`caramel.testing.run_workers`), three times per schedule in
the same process group: N steps straight, N/2 then stop, resume for the other N/2. The resumed
run must end with the very same parameters and optimizer state, bit for bit, and log the same
losses; dropout is on, so the random states must come back too. The same job then trains
`ps:consistency=ssp:2` for N steps, whose summary must carry what the servers did.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from caramel.testing import run_workers

STEPS = 6
# an explicit cut (before the hidden layers of the digits view): straight and resumed runs cut alike
SCHEDULES = ["pipeline:stages=2,microbatches=2,schedule=1f1b,partition=4",
             "pipeline:stages=2,microbatches=2,schedule=pipedream,partition=4"]
AUTO = "pipeline:stages=2,schedule=gpipe"  # partition and microbatches "auto"
PS = "ps:consistency=ssp:2"
PS_PROFILE_STEPS = 2  # the ps engine's profiling forwards, not logged (caramel.strategies.ps.run.PROFILE_STEPS)
# one worker runs the shared job for every test here (under --dist loadgroup, not once per worker)
pytestmark = pytest.mark.xdist_group("train_pipeline")


def _cfg(out: Path, strategy: str, **extra):
    from caramel.train.config import TrainConfig, apply_dict

    run = {"workload": "digits", "steps": STEPS, "out_dir": str(out), "log_every_steps": 100}
    run.update(extra.pop("run", {}))
    return apply_dict(TrainConfig(), {
        "run": run, "data": {"batch_size": 16},
        "model": {"d_model": 32, "layers": 2, "dropout": 0.1},
        "optim": {"lr": 0.01, "warmup_steps": 2},
        "parallel": {"strategy": strategy, "cluster": "off"},
        "checkpoint": {"every_steps": STEPS // 2, **extra.pop("checkpoint", {})},
    }, "test")


def resume_worker(rank: int, world: int, root: str, strategies: list[str]) -> dict:
    import json

    from caramel.train.loop import train
    out = {}
    for k, strategy in enumerate(strategies):
        base = Path(root) / str(k)
        straight = train(_cfg(base / "straight", strategy))
        train(_cfg(base / "resumed", strategy, run={"stop_after_steps": STEPS // 2}))
        resumed = train(_cfg(base / "resumed", strategy, checkpoint={"resume": "auto"}))
        losses = {}
        if rank == 0:
            for name in ("straight", "resumed"):
                rows = [json.loads(line) for line in (base / name / "metrics.jsonl").read_text().splitlines()]
                losses[name] = [(r["step"], r["loss"]) for r in rows if r["kind"] == "train"]
        out[strategy] = {"straight": straight, "resumed": resumed, "losses": losses}
    # partition and microbatches "auto" profile (timings differ run to run): the resumed run keeps the first half's
    auto = Path(root) / "auto"
    train(_cfg(auto, AUTO, run={"stop_after_steps": STEPS // 2}))
    out["auto"] = train(_cfg(auto, AUTO, checkpoint={"resume": "auto"}))
    out["ps"] = train(_cfg(Path(root) / "ps", PS, checkpoint={"every_steps": 0}))  # one checkpoint, at the end
    return out


def _final_state(summary: dict) -> dict:
    return torch.load(Path(summary["last_checkpoint"]) / "state.pt", weights_only=True)


def _flat(x, prefix=""):
    """Every tensor (and number) of a nested state, by path."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _flat(val, f"{prefix}/{key}").items()}
    if isinstance(x, (list, tuple)):
        return {k: v for i, val in enumerate(x) for k, v in _flat(val, f"{prefix}/{i}").items()}
    return {prefix: x}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_workers(resume_worker, 2, args=(str(tmp_path_factory.mktemp("train")), SCHEDULES), timeout_s=140)


@pytest.mark.timeout(150)
def test_pipeline_train_resumes_exactly_and_logs_the_whole_models_losses(ranks):
    for strategy in SCHEDULES:
        r0, r1 = ranks[0][strategy], ranks[1][strategy]
        straight, resumed = r0["straight"], r0["resumed"]
        assert resumed["start_step"] == STEPS // 2 and resumed["finished"], resumed
        # the same parameters, optimizer state and LR schedule, bit for bit
        a, b = _flat(_final_state(straight)), _flat(_final_state(resumed))
        keys = [k for k in a if k.startswith(("/model", "/optimizer", "/scheduler", "/pipeline"))]
        assert any(k.startswith("/optimizer/state/") for k in keys)  # the merged state of both stages
        for k in keys:
            va, vb = a[k], b[k]
            assert (torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb), (strategy, k)
        assert r0["losses"]["straight"] == r0["losses"]["resumed"]
        assert len(r0["losses"]["straight"]) == STEPS
        # rank 0 holds the first stage, rank 1 the last: both report the last stage's loss
        assert straight["first_loss"] == r1["straight"]["first_loss"] and straight["final_loss"] == r1["straight"]["final_loss"]
        # validation is the whole model's: recompute it here from the checkpoint, one process
        assert straight["val_loss"] == pytest.approx(_val_loss(_final_state(straight)), rel=1e-5)
        assert straight["val_predictions"] == 180
    auto = ranks[0]["auto"]
    half, end = (_final_state({"last_checkpoint": str(Path(auto["last_checkpoint"]).parent / f"ckpt-{k:09d}")})
                 for k in (STEPS // 2, STEPS))
    assert auto["start_step"] == STEPS // 2 and half["pipeline"] == end["pipeline"]
    assert len(end["pipeline"]["boundaries"]) == 1


@pytest.mark.timeout(150)
def test_ps_train_summary_carries_what_the_servers_did(ranks):
    s0, s1 = ranks[0]["ps"], ranks[1]["ps"]
    assert s0["strategy"] == PS and s0["finished"] and s0["ps"] == s1["ps"]  # gathered: alike on every rank
    ps = s0["ps"]
    assert ps["consistency"] == "ssp:2" and ps["updates_applied_per_rank"] == [STEPS, STEPS]
    assert ps["steps_per_rank"] == [STEPS, STEPS]
    assert ps["lr_scaled"] == 0 and ps["dc_corrected"] == 0 and ps["dc_missing"] == 0  # no scale, no compensate
    # [step, lag] of each forward after the profiling steps, on each rank, within the ssp bound
    logged = list(range(PS_PROFILE_STEPS, STEPS))
    assert [[step for step, _ in x] for x in ps["staleness_per_rank"]] == [logged, logged]
    assert all(0 <= lag <= 2 for x in ps["staleness_per_rank"] for _, lag in x)
    assert s0["staleness_mean"] == pytest.approx(sum(lag for _, lag in ps["staleness_per_rank"][0]) / len(logged))
    assert s0["trace"].endswith("trace.rank*.json")
    assert all((Path(s0["trace"]).parent / f"trace.rank{r}.json").exists() for r in (0, 1))


def _val_loss(state: dict) -> float:
    import torch.nn.functional as F

    from caramel.train.data import digits_datasets
    from caramel.train.workloads import DigitsNet

    model = DigitsNet(32, 2, 0.1)
    model.load_state_dict(state["model"])
    model.eval()
    _, val = digits_datasets(0.1)
    x, y = val.batch(torch.arange(len(val)))
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def test_pipeline_config_errors_name_the_input(tmp_path):
    from caramel.errors import CaramelError

    with pytest.raises(CaramelError, match="cannot cut workload char_gpt"):
        _cfg(tmp_path, "pipeline:stages=2", run={"workload": "char_gpt"})
    with pytest.raises(CaramelError, match="does not clip gradients"):
        from caramel.train.config import TrainConfig, apply_dict
        apply_dict(TrainConfig(), {"run": {"workload": "digits"}, "optim": {"clip_grad_norm": 1.0},
                                   "parallel": {"strategy": "pipeline"}}, "test")


def test_pipeline_needs_as_many_workers_as_stages_before_any_starts(tmp_path):
    from caramel.errors import CaramelError
    from caramel.train.workers import precheck

    cfg = _cfg(tmp_path, "pipeline:stages=3")
    cfg.parallel.workers = 2
    with pytest.raises(CaramelError, match="stages=3 x replicas=1 needs --workers 3, got --workers 2"):
        precheck(cfg)
    cfg.parallel.workers = 3
    precheck(cfg)
    cfg = _cfg(tmp_path, "pipeline:stages=2,replicas=2+1,schedule=gpipe,microbatches=4")
    cfg.parallel.workers = 4
    with pytest.raises(CaramelError, match=r"replicas=2\+1 \(their sum\) needs --workers 3, got --workers 4"):
        precheck(cfg)
    with pytest.raises(CaramelError, match=r"does not choose replica counts \(replicas=auto\)"):
        precheck(_cfg(tmp_path, "pipeline:replicas=auto"))
