"""Worker functions for the balancers' resume tests (spawned; must be importable).

Each runs N steps uninterrupted, saving a checkpoint at N/2 (synchronize, then the model's and
optimizer's state dicts through torch.save and torch.load(weights_only=True), as `caramel
train` does), then builds fresh model, optimizer and engine objects, loads that checkpoint and
runs the other N/2 steps. The step times the balancers read come from a fake clock (a fixed
cost per rank and per sample), so every decision, and with it every parameter, is
deterministic and the two runs must agree bit for bit.
"""
from __future__ import annotations

import io

import torch
import torch.nn.functional as F

import caramel
from caramel.models.zoo import SmallCNN
from caramel.strategies.caramel.balance import balanced_sampler
from tests.distributed.workers import params_of

SAMPLES = 96


class _FakeClock:
    """Replaces an engine's `EngineStats` class: the step period is `fixed_s + per_sample_s *
    local batch` (the balancer's), with no waits, whatever the real clock says."""

    fixed_s = 0.001
    per_sample_s = 0.001
    balancer = None

    @property
    def last_step_s(self) -> float:
        n = getattr(self.balancer, "local_batch", None) or 6
        return self.fixed_s + self.per_sample_s * n

    @last_step_s.setter
    def last_step_s(self, _value: float) -> None:
        pass

    @property
    def last_wait_s(self) -> float:
        return 0.0

    @last_wait_s.setter
    def last_wait_s(self, _value: float) -> None:
        pass


def _fake_clock(opt, per_sample_s: float) -> None:
    stats = opt.engine.stats
    cls = type("FakeClockStats", (_FakeClock, type(stats)),
               {"per_sample_s": per_sample_s, "balancer": opt.engine.controller.balancer})
    stats.__class__ = cls


def _dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(SAMPLES, 3, 16, 16, generator=g), torch.randint(0, 10, (SAMPLES,), generator=g)


def _roundtrip(obj) -> dict:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _build(options: dict, model_state: dict | None):
    torch.manual_seed(0)
    m = SmallCNN()
    if model_state is not None:
        m.load_state_dict(model_state)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return caramel.parallelize(m, opt, overlap="forward", **options)


def _batch(step: int, rank: int) -> list[int]:
    """Rank `rank`'s 6 sample indices at `step`, the same in every arm of a comparison."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, SAMPLES, (6,), generator=g).tolist()


def _step(model, opt, xs: torch.Tensor, ys: torch.Tensor, idx: list[int]) -> None:
    F.cross_entropy(model(xs[idx]), ys[idx]).backward()
    opt.step()
    opt.zero_grad()


def _run(options: dict, rank: int, steps: int, half: int, per_sample_s: float, resume: bool) -> tuple:
    """(parameters, balancer) after `steps`, uninterrupted or resumed from a checkpoint at `half`."""
    xs, ys = _dataset()
    model, opt = _build(options, None)
    sampler = balanced_sampler(opt, SAMPLES, 16) if options["balance"] == "batch" else None
    _fake_clock(opt, per_sample_s)
    start = 0
    for s in range(steps):
        if s == half:
            opt.synchronize()
            saved = _roundtrip({"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                                "optimizer": opt.state_dict()})
            if resume:  # fresh objects, loaded from the checkpoint
                model, opt = _build(options, saved["model"])
                sampler = balanced_sampler(opt, SAMPLES, 16) if sampler is not None else None
                opt.load_state_dict(saved["optimizer"])
                _fake_clock(opt, per_sample_s)
                start = s
        if sampler is not None:
            idx = sampler.batch(s)
            sampler.schedule.drawn = s + 1  # as caramel train's BatchSource: these shares are drawn
        else:
            idx = _batch(s, rank)
        _step(model, opt, xs, ys, idx)
    opt.synchronize()
    return params_of(model.module), opt.engine.controller.balancer, start


def dropout_resume_worker(rank: int, world: int, table: str, steps: int, half: int) -> dict:
    """balance="dropout", rank 1 twice as slow: the drop is proposed before `half` and confirmed after."""
    torch.set_num_threads(1)
    options = {"balance": "dropout", "dropout_table": table, "balance_every": 2}
    out = []
    for resume in (False, True):
        params, b, start = _run(options, rank, steps, half, 0.001 * (1 + rank), resume)
        out.append({"params": params, "fractions": list(b.fractions), "step": b.step,
                    "last": b.confirmation.last, "times": list(b.times), "changes": b.changes, "start": start})
    return _compare(out)


def batch_resume_worker(rank: int, world: int, steps: int, half: int) -> dict:
    """balance="batch", rank 1 three times as slow per sample: shares change before and after `half`."""
    torch.set_num_threads(1)
    options = {"balance": "batch", "balance_every": 2}
    out = []
    for resume in (False, True):
        params, b, start = _run(options, rank, steps, half, 0.001 * (1 + 2 * rank), resume)
        out.append({"params": params, "schedule": b.schedule.state_dict(), "steps": b._steps, "fixed_s": b.fixed_s,
                    "times": {n: list(q) for n, q in b.times.items()}, "changes": b.changes, "start": start})
    return _compare(out)


def auto_resume_worker(rank: int, world: int, steps: int, half: int) -> dict:
    """compression="auto" planned for a 1 Mbit/s link (given, so the choice does not follow the
    loopback's speed): the plan compresses. The run saves at `half` and goes on; fresh objects
    loaded from that checkpoint run the same steps (the plan comes from the profile's timings,
    so both arms start from the one checkpoint). No bandwidth check falls within the 8 steps."""
    from caramel.topology.spec import ClusterSpec

    torch.set_num_threads(1)
    xs, ys = _dataset()
    options = {"compression": "auto", "cluster": ClusterSpec.uniform(world, 1e6)}

    def run(model, opt, first: int, last: int) -> None:
        for s in range(first, last):
            _step(model, opt, xs, ys, _batch(s, rank))
        opt.synchronize()

    def result(model, opt) -> dict:
        return {"params": params_of(model.module), "plan": opt.engine.plan.fingerprint,
                "codecs": list(opt.engine.plan.compression or []), "replans": opt.engine.stats.replans}

    model, opt = _build(options, None)
    run(model, opt, 0, half)
    saved = _roundtrip({"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                        "optimizer": opt.state_dict()})
    at_save = opt.engine.plan.fingerprint
    run(model, opt, half, steps)
    full = {**result(model, opt), "plan_at_save": at_save}
    # a checkpoint from before the entry existed: loads, and the engine profiles as it always did
    _, older = _build(options, saved["model"])
    older.load_state_dict({k: v for k, v in saved["optimizer"].items() if k != "caramel_adaptive"})
    full["older_checkpoint_profiles"] = older.engine.controller.profiling
    model, opt = _build(options, saved["model"])
    opt.load_state_dict(saved["optimizer"])
    profiling = opt.engine.controller.profiling
    run(model, opt, half, steps)
    return _compare([full, {**result(model, opt), "profiling_after_load": profiling}])


def resume_worker(rank: int, world: int, table: str) -> dict:
    """Both balancers and compression="auto" in one spawn (10 steps saved at 7 and 7, 8 saved at 5)."""
    return {"dropout": dropout_resume_worker(rank, world, table, 10, 7), "batch": batch_resume_worker(rank, world, 10, 7),
            "auto": auto_resume_worker(rank, world, 8, 5)}


def _compare(out: list[dict]) -> dict:
    full, resumed = out
    same_params = all(torch.equal(a, b) for a, b in zip(full.pop("params"), resumed.pop("params")))
    return {"same_params": same_params, "full": full, "resumed": resumed}
