"""`caramel.parallelize(model, optimizer, strategy=...)`: every strategy through one entry, checked
against torch DDP on two gloo workers."""
import pytest
import torch
import torch.nn as nn

import caramel
from caramel.errors import CaramelError
from caramel.strategies.caramel.options import CaramelOptions
from caramel.testing import run_workers

STEPS = 6


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_misspelled_option_is_an_error_before_anything_starts():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CaramelError, match="unknown option 'overlpa'; did you mean 'overlap'"):
        caramel.parallelize(model, opt, overlpa="forward")
    with pytest.raises(CaramelError, match="options must be a CaramelOptions"):
        caramel.parallelize(model, opt, strategy="caramel", options={"overlap": "forward"})
    with pytest.raises(CaramelError, match="either as an options object or as keywords"):
        caramel.parallelize(model, opt, options=CaramelOptions(), overlap="forward")
    with pytest.raises(CaramelError, match="strategy 'ddp' takes no plan"):
        caramel.parallelize(model, opt, strategy="ddp", plan="plan.json")


def _train(rank: int, world: int, strategy: str) -> dict:
    import torch.distributed as dist

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if strategy == "torch":
        wrapped = nn.parallel.DistributedDataParallel(model)
    else:
        wrapped, opt = caramel.parallelize(model, opt, strategy=strategy)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()
        opt.zero_grad()
    if strategy != "torch":
        opt.synchronize()
    dist.barrier()
    return {k: v.detach().flatten().tolist() for k, v in model.state_dict().items()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp:comm_priority=auto,bucket_cap_mb=0.0001",
                                      "caramel:overlap=forward,planner=fifo", "caramel"])
def test_every_strategy_matches_torch_ddp(strategy):
    ref = run_workers(_train, 2, args=("torch",), timeout_s=240)
    got = run_workers(_train, 2, args=(strategy,), timeout_s=240)
    for rank in range(2):
        for key in ref[rank]:
            diff = (torch.tensor(got[rank][key]) - torch.tensor(ref[rank][key])).abs().max().item()
            assert diff <= 1e-5, (strategy, rank, key, diff)
