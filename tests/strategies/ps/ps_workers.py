"""Worker functions of the ps strategy's multi-process tests (spawned; must be importable)."""
from __future__ import annotations

import copy

import torch

import caramel
from tests.distributed.workers import FAMILIES, OPTIMIZERS, batch, fresh, make_optimizer, max_diff, params_of, train


def _ps(family: str, opt_kind: str, steps: int, rank: int, spec: str, **kw):
    w = fresh(family)
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer(opt_kind, m.parameters())
    model, opt = caramel.parallelize(m, opt, spec, **kw)
    train(model, opt, sched, w.loss_fn, family, rank, steps)
    opt.synchronize()
    return model, opt


def parity_worker(rank: int, world: int, steps: int, specs: tuple[str, ...]) -> dict:
    """Every family x optimizer (LR scheduler included) under each ps spec, against DDP."""
    out = {}
    for family in FAMILIES:
        for opt_kind in OPTIMIZERS:
            w = fresh(family)
            ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=(family == "mlp_unused"))
            ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
            train(ddp, ropt, rsched, w.loss_fn, family, rank, steps)
            ref = params_of(ddp.module)
            for spec in specs:
                model, opt = _ps(family, opt_kind, steps, rank, spec)
                out[(family, opt_kind, spec)] = max_diff(ref, params_of(model.module))
                out[(family, opt_kind, spec, "state")] = len(opt.state)
            caramel.shutdown()
    return out


def order_worker(rank: int, world: int, steps: int, specs: tuple[str, ...]) -> dict:
    """Per spec: the plan, the recorded pull (send) order of every update, stats."""
    out = {}
    for spec in specs:
        model, opt = _ps("gpt_tied", "adam", steps, rank, spec)
        run = opt.ps
        plan = run.engine.plan
        out[spec] = {"pull_order": plan.pull_order, "push_order": plan.push_order, "owner": plan.owner,
                     "sent": list(run.engine.send_log), "expected": {u: plan.pull_order_at(u) for u, _ in run.engine.send_log},
                     "stats": run.stats_dict(), "params": [t.numpy() for t in params_of(model.module)]}
        caramel.shutdown()
    return out
