"""Worker for the branch-order parity test (spawned; must be importable)."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

import caramel
from caramel.models import get_model
from caramel.profile.profiler import profile_model
from caramel.topology.spec import ClusterSpec
from tests.distributed.workers import max_diff, params_of

OPTIONS = {"vocab": 20000, "seq": 32, "channels": 64}


def _batch(step: int, rank: int):
    w = get_model("two_tower")(batch_size=4, seed=1000 + 31 * step + rank, **OPTIONS)
    return w.inputs, w.targets


def _train(model, opt, loss_fn, rank, steps):
    for step in range(steps):
        x, y = _batch(step, rank)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def branch_order_worker(rank: int, world: int, steps: int) -> dict:
    """two_tower with `branch_order="auto"` on a slow link (the planner reorders the towers)
    against torch DDP: the parameters after `steps` steps, and the order that ran."""
    torch.set_num_threads(1)
    w = get_model("two_tower")(batch_size=4, seed=0, **OPTIONS)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    _train(ddp, ropt, w.loss_fn, rank, steps)
    m = copy.deepcopy(w.model)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    # a link at comm/compute = 1 for rank 0's profile (the rank that plans), where running the
    # conv tower first pays most (docs/results/branch_order.json)
    prof = profile_model(copy.deepcopy(w.model), w.inputs, w.targets, w.loss_fn, steps=2)
    bw = [8 * prof.total_grad_bytes() / prof.compute_time_s]
    dist.broadcast_object_list(bw, src=0)
    cluster = ClusterSpec.uniform(world, bw[0], 50e-6)
    model, opt = caramel.parallelize(m, opt, overlap="forward", branch_order="auto", cluster=cluster, profile=prof)
    _train(model, opt, w.loss_fn, rank, steps)
    opt.synchronize()
    engine = opt.engine
    return {"diff": max_diff(params_of(ddp.module), params_of(model.module)),
            "module_order": engine.plan.module_order, "running": engine.branch_forward.order,
            "decision": engine.plan.options.get("branch_order"),
            "state_dict_keys": list(model.module.state_dict()) == list(w.model.state_dict())}
