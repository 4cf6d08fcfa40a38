"""`mute_gradient_communication`: every rank then updates with its own gradients (pre-divided by the
world size), exactly as a single process would, while the rest of the engine runs (2 spawned ranks, gloo)."""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.testing import run_workers

from caramel.plan.plan import OVERLAPS


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _muted_and_alone(model, probe, loss_fn, batches, rank: int, world: int, overlap: str, cap_mb: float):
    """`model` trained muted (a fifo plan with `cap_mb` buckets, from rank 0's profile on `probe`)
    beside a copy trained alone on the same batches; returns the muted optimizer (not yet
    released), the plan and the largest parameter difference."""
    import caramel
    from caramel.strategies.planners import make_plan
    from caramel.strategies.caramel.parallelize import mute_gradient_communication

    ref = copy.deepcopy(model)
    profile = caramel.profile_model(copy.deepcopy(model), *probe, loss_fn, steps=1)
    box = [make_plan("fifo", profile, world_size=world, bucket_cap_mb=cap_mb, first_bucket_mb=cap_mb) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wrapped, opt = caramel.parallelize(model, opt, plan=box[0], overlap=overlap, timeout_s=30)
    mute_gradient_communication(opt)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        # the engine pre-divides every gradient by the world size: the reference's loss is divided too
        for m, o, scale in ((wrapped, opt, 1.0), (ref, ref_opt, 1.0 / world)):
            (scale * loss_fn(m(x), y)).backward()
            o.step()
            o.zero_grad()
    opt.synchronize()
    return opt, box[0], max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def _muted_worker(rank: int, world: int) -> dict:
    out = {}
    for overlap in OVERLAPS:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
        opt, plan, diff = _muted_and_alone(model, _batch(0, 0), nn.functional.mse_loss,
                                           [_batch(step, rank) for step in range(3)], rank, world, overlap, 0.001)
        out[overlap] = {"buckets": len(plan.buckets), "max_diff": diff,
                        "params": [p.detach().flatten().tolist() for p in model.parameters()]}
        opt.engine.release()
    return out


@pytest.mark.timeout(120)
def test_muted_engine_trains_each_rank_on_its_own_gradients():
    r0, r1 = run_workers(_muted_worker, 2, timeout_s=100)
    for overlap in OVERLAPS:
        assert r0[overlap]["buckets"] > 1  # several buckets, so several collectives were muted
        # each rank matches its own single-process run ...
        assert r0[overlap]["max_diff"] < 1e-6 and r1[overlap]["max_diff"] < 1e-6, overlap
        # ... and the ranks, on different data, no longer agree: nothing was averaged
        assert max(abs(a - b) for p, q in zip(r0[overlap]["params"], r1[overlap]["params"]) for a, b in zip(p, q)) > 1e-3


def _muted_tied_worker(rank: int, world: int) -> dict:
    """A tied embedding's rows are muted too: each rank ends where its own run would."""
    from caramel.models import get_model
    from caramel.models.zoo import _tokens

    out = {}
    for overlap in ("forward", "backward"):
        w = get_model("tiny_gpt")(batch_size=2, seed=0)
        batches = [_tokens(1 + (step + rank) % 2, 16, 64, seed=10 * step + rank) for step in range(4)]  # the capacity grows
        opt, plan, diff = _muted_and_alone(copy.deepcopy(w.model), (w.inputs, w.targets), w.loss_fn, batches,
                                           rank, world, overlap, 0.01)
        out[overlap] = {"exchanges": len(opt.engine.row_exchanges), "buckets": len(plan.buckets), "max_diff": diff}
        opt.engine.release()
    return out


@pytest.mark.timeout(120)
def test_muted_engine_mutes_a_tied_embeddings_rows():
    for res in run_workers(_muted_tied_worker, 2, timeout_s=100):
        for overlap, r in res.items():
            assert r["exchanges"] == 1 and r["buckets"] > 1 and r["max_diff"] < 1e-5, (overlap, r)


@pytest.mark.timeout(10)
def test_mute_needs_an_optimizer_from_parallelize():
    from caramel.strategies.caramel.parallelize import mute_gradient_communication

    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(CaramelError, match="not one that caramel.parallelize returned"):
        mute_gradient_communication(opt)


class _Reorders(nn.Module):
    """Two blocks whose order flips when `swap` is set: the forward's module order changes."""

    def __init__(self):
        super().__init__()
        self.inp, self.a, self.b, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.swap = False

    def forward(self, x):
        first, second = (self.b, self.a) if self.swap else (self.a, self.b)
        return self.head(torch.relu(second(torch.relu(first(torch.relu(self.inp(x)))))))


def _online_worker(rank: int, world: int) -> dict:
    """Muting is refused while the engine profiles or trials; once settled it mutes, each rank then
    trains as its own single process would, and a changed module order starts no new profile."""
    import caramel
    from caramel.runtime import schedule_settled
    from caramel.strategies.caramel.parallelize import mute_gradient_communication

    torch.manual_seed(0)
    model = _Reorders()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wrapped, opt = caramel.parallelize(model, opt, overlap="auto", timeout_s=30, check_every=2, trial_steps=2,
                                       trial_passes=1)
    loss_fn = nn.functional.mse_loss
    refused, step = [], 0
    while not schedule_settled(opt):
        assert step < 40, "the schedule did not settle"  # 4 profiling steps, a trial of 6 blocks of 2 and a confirmation of 8
        try:
            mute_gradient_communication(opt)
        except CaramelError as e:
            refused.append("online profiling" if "online profiling" in str(e) else "overlap trial" if "overlap trial" in str(e) else str(e))
        x, y = _batch(step, rank)
        loss_fn(wrapped(x), y).backward()
        opt.step()
        opt.zero_grad()
        step += 1
    out = {"refused": sorted(set(refused)), "delegating": opt.engine.delegating}
    if opt.engine.delegating:  # the trial kept DDP's schedule: muting is torch's noop_hook then
        return out
    mute_gradient_communication(opt)
    torch.manual_seed(0)
    ref = _Reorders()
    ref.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    replans = opt.engine.stats.replans
    for s in range(step, step + 6):
        model.swap = ref.swap = s >= step + 2  # caught by the check every 2 steps
        x, y = _batch(s, rank)
        for m, o, scale in ((wrapped, opt, 1.0), (ref, ref_opt, 1.0 / world)):
            (scale * loss_fn(m(x), y)).backward()
            o.step()
            o.zero_grad()
    opt.synchronize()
    out.update(max_diff=max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())),
               order_changes=opt.engine.stats.extra.get("order_changes", 0), new_plans=opt.engine.stats.replans - replans,
               settled=schedule_settled(opt))
    opt.engine.release()
    return out


@pytest.mark.timeout(150)
def test_mute_waits_for_a_settled_schedule_and_freezes_it():
    for r in run_workers(_online_worker, 2, timeout_s=130):
        assert r["refused"] == ["online profiling", "overlap trial"], r
        if r["delegating"]:
            continue
        assert r["max_diff"] < 1e-6, r
        assert r["order_changes"] >= 1 and r["new_plans"] == 0 and r["settled"], r
