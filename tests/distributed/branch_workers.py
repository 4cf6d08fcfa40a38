"""Worker for the branch-order parity test (spawned; must be importable)."""
from __future__ import annotations

import copy

import torch

import caramel
from caramel.models import get_model
from caramel.profile.profiler import profile_model
from caramel.topology.spec import ClusterSpec
from tests.distributed.workers import max_diff, params_of

OPTIONS = {"vocab": 5000, "seq": 16, "channels": 16}


def _batch(step: int, rank: int):
    w = get_model("two_tower")(batch_size=4, seed=1000 + 31 * step + rank, **OPTIONS)
    return w.inputs, w.targets


def _train(model, opt, loss_fn, rank, steps):
    for step in range(steps):
        x, y = _batch(step, rank)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def steady_profile(prof):
    """`prof` with fixed module times: 2 ms forward and 4 ms backward per convolution, 0.1 and
    0.2 ms for every other module; starts, first uses and gradient-ready times laid out as a
    chain (forward in module order, backward in reverse)."""
    fwd = [2e-3 if m.type == "Conv1d" else 1e-4 for m in prof.modules]
    bwd = [2 * f for f in fwd]
    t, done = 0.0, {}
    for m, b in zip(reversed(prof.modules), reversed(bwd)):
        t += b
        done[m.name] = t
    start, t = {}, 0.0
    for m, f, b in zip(prof.modules, fwd, bwd):
        start[m.name], t = t, t + f
        m.forward_start_s, m.forward_time_s, m.backward_time_s = start[m.name], f, b
    for p in prof.params:
        first = prof.modules[p.first_use_order].name
        p.first_use_time_s, p.ready_time_s = start[first], done[first]
    prof.forward_time_s, prof.backward_time_s, prof.optimizer_time_s = sum(fwd), sum(bwd), 0.0
    return prof


def branch_order_worker(rank: int, world: int, steps: int) -> dict:
    """two_tower with `branch_order="auto"` at comm/compute 1 (the planner reorders the towers)
    against torch DDP: the parameters after `steps` steps, and the order that ran."""
    torch.set_num_threads(1)
    w = get_model("two_tower")(batch_size=4, seed=0, **OPTIONS)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    _train(ddp, ropt, w.loss_fn, rank, steps)
    m = copy.deepcopy(w.model)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    # the measured profile's structure with fixed times (a loaded test machine times anything),
    # on a link at comm/compute = 1, where running the conv tower first pays most
    prof = steady_profile(profile_model(copy.deepcopy(w.model), w.inputs, w.targets, w.loss_fn, steps=1))
    cluster = ClusterSpec.uniform(world, 8 * prof.total_grad_bytes() / prof.compute_time_s, 50e-6)
    # input_spread=0 and no deferral: one search per candidate order, so the test plans fast
    model, opt = caramel.parallelize(m, opt, overlap="forward", branch_order="auto", cluster=cluster, profile=prof,
                                     input_spread=0, compute_schedule="off", check_every=3)
    _train(model, opt, w.loss_fn, rank, steps)
    opt.synchronize()
    engine = opt.engine
    return {"diff": max_diff(params_of(ddp.module), params_of(model.module)),
            "module_order": engine.plan.module_order, "running": engine.branch_forward.order,
            "decision": engine.plan.options.get("branch_order"),
            # the periodic checks (every 3 steps) saw the modules run in the plan's order
            "order_changes": engine.stats.extra.get("order_changes", 0), "replans": engine.stats.replans,
            "state_dict_keys": list(model.module.state_dict()) == list(w.model.state_dict())}
