"""The replicas' engine options are the runtime's (pinned here), and the simulator's
`replica_plan` makes the call the engine's controller makes (`Controller.plan_from_profile`)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.profile.profiler import profile_model
from caramel.strategies.api import DEFAULT_SESSION
from caramel.strategies.caramel import controller as controller_module
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.caramel.parallelize import parallelize_caramel
from caramel.strategies.pipeline import planner_buckets
from caramel.strategies.pipeline.replica_options import replica_engine_options


def test_the_replica_engine_options_are_the_runtimes_literal_values():
    # the RUNTIME's setting (replica_reduce.caramel_replicas builds each stage's engine from it):
    # early weight gradients or split layers would break training under microbatching, so a
    # change here must be a deliberate change of this test, not a tuning of the simulator
    assert replica_engine_options() == CaramelOptions(overlap="forward", check_every=0, split_tied=False,
                                                      compute_schedule="off", early_weight_grad=False)
    # replica_plan mirrors the controller's call without its compression step: that holds only
    # while the replicas' engine compresses nothing
    assert replica_engine_options().compression == "none"


class _Called(Exception):
    pass


def _spy(box: dict):
    def make_plan(*args, **kwargs):
        box["args"], box["kwargs"] = args, kwargs
        raise _Called
    return make_plan


def _normal(args: tuple, kwargs: dict) -> tuple:
    planner, profile, cluster = args
    return planner, profile.to_dict(), cluster.to_dict(), kwargs


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp_path, "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_replica_plan_makes_the_controllers_planner_call(monkeypatch, one_rank):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    profile = profile_model(model, x, y, nn.functional.mse_loss, steps=1, warmup=0, split_tied=False)
    # the engine as caramel_replicas builds it (one rank: it plans nothing until asked)
    parallelize_caramel(model, optimizer, replica_engine_options(), session=DEFAULT_SESSION,
                        broadcast_buffers=False, optimizer_holds_more=True)
    controller = optimizer._caramel_engine.controller
    engine_call, sim_call = {}, {}
    monkeypatch.setattr(controller_module, "make_plan", _spy(engine_call))
    monkeypatch.setattr(planner_buckets, "make_plan", _spy(sim_call))
    with pytest.raises(_Called):
        controller.plan_from_profile(profile)
    with pytest.raises(_Called):
        planner_buckets.replica_plan(profile, 1)
    assert _normal(sim_call["args"], sim_call["kwargs"]) == _normal(engine_call["args"], engine_call["kwargs"])
    assert engine_call["kwargs"]["overlap"] == "forward" and engine_call["args"][0] == "caramel"
