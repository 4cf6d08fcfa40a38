"""`mute_gradient_communication`: every rank then updates with its own gradients (pre-divided by the
world size), exactly as a single process would, while the rest of the engine runs (2 spawned ranks, gloo)."""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.testing import run_workers

OVERLAPS = ("forward", "backward", "none")


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _muted_and_alone(model, probe, loss_fn, batches, rank: int, world: int, overlap: str, cap_mb: float):
    """`model` trained muted (a fifo plan with `cap_mb` buckets, from rank 0's profile on `probe`)
    beside a copy trained alone on the same batches; returns the muted optimizer (not yet
    released), the plan and the largest parameter difference."""
    import caramel
    from caramel.plan.planners import make_plan
    from caramel.runtime import mute_gradient_communication

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
    from caramel.runtime import mute_gradient_communication

    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(CaramelError, match="not one that caramel.parallelize returned"):
        mute_gradient_communication(opt)
