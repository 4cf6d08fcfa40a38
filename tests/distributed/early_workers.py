"""Worker for the early weight gradient test (spawned; must be importable)."""
from __future__ import annotations

import copy

import torch

import caramel
from tests.distributed.workers import batch, fresh, make_optimizer, max_diff, params_of, train


def early_weight_grad_worker(rank: int, world: int, steps: int) -> dict:
    """The tied transformer with and without early weight gradients, against DDP: the parameters'
    largest difference and the layers that went early once the plan was in force."""
    out = {}
    w = fresh("gpt_tied")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt, rsched = make_optimizer("adam", ddp.parameters())
    train(ddp, ropt, rsched, w.loss_fn, "gpt_tied", rank, steps)
    ref = params_of(ddp.module)
    for early in (True, False):
        m = copy.deepcopy(w.model)
        opt, sched = make_optimizer("adam", m.parameters())
        model, opt = caramel.parallelize(m, opt, planner="caramel", overlap="forward", early_weight_grad=early)
        handed = []  # early hand-overs in each step (the fallback is exact too: only this shows the path ran)
        for step in range(steps):
            before = opt.engine.early_handovers
            x, y = batch("gpt_tied", step, rank)
            w.loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            handed.append(opt.engine.early_handovers - before)
        out[(early, "handed")] = handed
        opt.synchronize()
        out[(early, "diff")] = max_diff(ref, params_of(model.module))
        out[(early, "early")] = [name for name, _ in opt.engine._early_names]
        first = [opt.engine.names[i] for i in opt.engine.plan.buckets[opt.engine.plan.order[0][0]].params]
        out[(early, "first bucket")] = sorted(first)
        # which layers the plan in force makes eligible depends on the profiled timings (the first
        # collective's contents), so the expected set is derived from it: the plain dense layers
        # whose weight travels first (attention's out_proj is read functionally, never called)
        by_name = dict(model.module.named_parameters())
        first_ids = {id(by_name[n]) for n in first}
        out[(early, "eligible")] = sorted(name for name, mod in model.module.named_modules()
                                          if type(mod) is torch.nn.Linear and id(mod.weight) in first_ids)
        caramel.shutdown()
    return out
