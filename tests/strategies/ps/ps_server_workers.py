"""Worker functions of the dedicated-server tests (spawned; must be importable).

Every process runs the same function, as every process of a job runs the user's script: on
the last `servers` ranks `caramel.parallelize` serves and raises `ServerFinished` when the
workers shut the model down, which these functions catch to go on to the next model.
"""
from __future__ import annotations

import copy
import os
import signal
import time

import torch
import torch.distributed as dist

import caramel
from caramel.strategies.ps.server import ServerFinished
from tests.distributed.workers import batch, fresh, make_optimizer, max_diff, params_of, train
from tests.strategies.ps.ps_workers import sent_pulls, train_clipped
from tests.strategies.ps.wire_log import wire_logged


def _run(family: str, opt_kind: str, spec: str, steps: int, rank: int, first: int = 0, load: dict | None = None):
    """Parallelize (a server serves here, then raises ServerFinished) and train `steps` steps."""
    w = fresh(family)
    if load is not None:
        w.model.load_state_dict(load["model"])
    opt, sched = make_optimizer(opt_kind, w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, spec)
    if load is not None:
        opt.load_state_dict(load["opt"])
        sched.load_state_dict(load["sched"])
    for step in range(first, first + steps):
        x, y = batch(family, step, rank)
        w.loss_fn(model(x), y).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    opt.synchronize()
    return model, opt, sched


def parity_worker(rank: int, world: int, steps: int, servers: int, cases: tuple[tuple[str, str, str], ...]) -> dict:
    """Each (family, optimizer, spec) under dedicated servers against DDP over the workers only;
    the workers' plan order of every update, and the servers' pulls as their ordered sender
    handed them to the gloo groups (`wire_log.py`)."""
    workers = world - servers
    group = dist.new_group(list(range(workers)))  # every rank creates it; only workers use it
    out: dict = {}
    for family, opt_kind, spec in cases:
        if rank < workers:
            w = fresh(family)
            ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), process_group=group,
                                                            find_unused_parameters=(family == "mlp_unused"))
            ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
            clip = float(spec.split("clip_grad_norm=")[1].split(",")[0]) if "clip_grad_norm=" in spec else 0.0
            out[(family, opt_kind, spec, "clipped")] = train_clipped(ddp, ropt, rsched, w.loss_fn, family, rank, steps, clip)
            model, opt, _ = _run(family, opt_kind, spec, steps, rank)
            out[(family, opt_kind, spec, "pulls")] = sent_pulls(opt.ps.engine)
            out[(family, opt_kind, spec)] = max_diff(params_of(ddp.module), params_of(model.module))
            out[(family, opt_kind, spec, "moved")] = max_diff(params_of(fresh(family).model), params_of(model.module))
            out[(family, opt_kind, spec, "state")] = len(opt.state_dict()["state"])
            out[(family, opt_kind, spec, "owners")] = sorted(set(opt.ps.engine.server_ranks().values()))
            caramel.shutdown()
        else:
            with wire_logged() as wire:
                try:
                    _run(family, opt_kind, spec, steps, rank)
                    out[(family, opt_kind, spec)] = "returned"
                except ServerFinished as done:
                    out[(family, opt_kind, spec)] = done.stats
            out[(family, opt_kind, spec, "wire")] = wire
    return out


def suite_worker(rank: int, world: int, bad: tuple, steps: int, servers: int, cases: tuple, ckpt_steps: int,
                 ckpt_spec: str) -> dict:
    """`bad_input_worker`, `parity_worker`, `checkpoint_worker`, `ssp_worker` in one job (one start-up)."""
    return {"bad": bad_input_worker(rank, world, bad),
            "parity": parity_worker(rank, world, steps, servers, cases),
            "checkpoint": checkpoint_worker(rank, world, ckpt_steps, servers, ckpt_spec),
            "ssp": ssp_worker(rank, world, 10, servers, 0.03)}


def ssp_worker(rank: int, world: int, steps: int, servers: int, slow_s: float) -> dict:
    """ssp:2 with an LR scheduler (new hyper-parameters every step) and rank 1 sleeping
    `slow_s` before each step: rank 0 must still run ahead, up to the bound."""
    w = fresh("gpt_tied")
    opt, sched = make_optimizer("adam", w.model.parameters())
    try:
        model, opt = caramel.parallelize(w.model, opt, f"ps:servers={servers},dedicated=true,consistency=ssp:2")
    except ServerFinished as done:
        return done.stats
    for step in range(steps):
        if rank == 1:
            time.sleep(slow_s)
        x, y = batch("gpt_tied", step, rank)
        w.loss_fn(model(x), y).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    staleness = opt.ps.stats_dict()["staleness"]
    caramel.shutdown()
    return {"staleness": staleness}


def checkpoint_worker(rank: int, world: int, steps: int, servers: int, spec: str) -> dict:
    """2*steps at once, or steps, a checkpoint (saved on rank 0, server state included), a fresh
    model and optimizer that load it, and steps more: the two must be equal."""
    workers = world - servers
    group = dist.new_group(list(range(workers)))
    out: dict = {"served": []}
    try:
        ref, _, _ = _run("gpt_tied", "adamw", spec, 2 * steps, rank)
        out["ref"] = params_of(ref.module)
        caramel.shutdown()
    except ServerFinished as done:
        out["served"].append(done.stats)
    saved: list = [None]
    try:
        model, opt, sched = _run("gpt_tied", "adamw", spec, steps, rank)
        if rank == 0:
            saved = [{"model": copy.deepcopy(model.module.state_dict()), "opt": copy.deepcopy(opt.state_dict()),
                      "sched": sched.state_dict()}]
        caramel.shutdown()
    except ServerFinished as done:
        out["served"].append(done.stats)
    if rank < workers:
        dist.broadcast_object_list(saved, src=0, group=group)
        out["saved_state_entries"] = len(saved[0]["opt"]["state"])
    try:
        resumed, _, _ = _run("gpt_tied", "adamw", spec, steps, rank, first=steps, load=saved[0])
        out["diff"] = max_diff(out.pop("ref"), params_of(resumed.module))
        out["params"] = len(list(resumed.module.parameters()))
        caramel.shutdown()
    except ServerFinished as done:
        out["served"].append(done.stats)
    return out


def dead_server_worker(rank: int, world: int, timeout_s: float) -> dict:
    """After 3 steps rank 0 stops the server process (SIGSTOP: alive, silent); the workers' next
    step must fail within the timeout instead of hanging. The server is resumed afterwards and
    finds its peers gone."""
    pids: list = [None] * world
    dist.all_gather_object(pids, os.getpid())
    w = fresh("cnn_bn")
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    try:
        model, opt = caramel.parallelize(w.model, opt, "ps:servers=1,dedicated=true", timeout_s=timeout_s)
    except ServerFinished:
        return {"error": None}
    except RuntimeError as e:  # the server: resumed after the workers gave up
        return {"error": str(e)[:300]}
    train(model, opt, sched, w.loss_fn, "cnn_bn", rank, 3)
    opt.synchronize()
    if rank == 0:
        os.kill(pids[-1], signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        train(model, opt, sched, w.loss_fn, "cnn_bn", rank, 3)
        opt.synchronize()
        err = None
    except RuntimeError as e:
        err = str(e)[:300]
    elapsed = time.monotonic() - t0
    if rank == 0:
        os.kill(pids[-1], signal.SIGCONT)
    return {"error": err, "elapsed_s": elapsed}


def bad_input_worker(rank: int, world: int, cases: tuple) -> list:
    """The error (if any) `parallelize` gives for each (spec, CARAMEL_PS_SERVERS value)."""
    out = []
    for spec, env in ((c[0], c[1]) for c in cases):
        if env is not None:
            os.environ["CARAMEL_PS_SERVERS"] = env
        w = fresh("cnn_bn")
        opt, _ = make_optimizer("sgd_momentum", w.model.parameters())
        try:
            caramel.parallelize(w.model, opt, spec)
            out.append(None)
            caramel.shutdown()
        except caramel.CaramelError as e:
            out.append(str(e))
        finally:
            os.environ.pop("CARAMEL_PS_SERVERS", None)
    return out
