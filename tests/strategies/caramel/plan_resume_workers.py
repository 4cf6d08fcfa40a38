"""Worker functions for the plan-resume test (spawned; must be importable).

`full_worker` trains `STEPS` steps uninterrupted for every compression mode, writing each
rank's checkpoint (model and optimizer state dicts, as `torch.save` files) after `HALF` steps
and its losses and parameters at the end; `resumed_worker`, in fresh processes, builds new
model, optimizer and engine objects, loads those checkpoints, trains the other steps and
compares. Batches are drawn per (step, rank) from a seeded generator, so the two arms see the
same data and must agree bit for bit.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.distributed.workers import params_of
from tests.strategies.adapt.resume_workers import _batch, _dataset
from tests.strategies.adapt.resume_workers import _build as build_smallcnn

STEPS, HALF = 6, 3
# every fixed codec; the planner splits SmallCNN into several buckets where the provisional plan
# of a re-profiling engine has one, so top-k would pick other entries during those steps
MODES = {"none": {}, "fp16": {"compression": "fp16"}, "topk": {"compression": "topk:0.1"},
         "powersgd": {"compression": "powersgd:2"}}
# with build_smallcnn's overlap="forward": settled after 3 steps (uses, split, 1 timed)
COMMON = {"profile_steps": 1}


def _build(options: dict, model_state: dict | None):
    return build_smallcnn({**COMMON, **options}, model_state)


def _train(model, opt, rank: int, first: int, last: int) -> list[float]:
    xs, ys = _dataset()
    losses = []
    for s in range(first, last):
        idx = _batch(s, rank)
        loss = F.cross_entropy(model(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    opt.synchronize()
    return losses


def _path(root: str, mode: str, rank: int) -> Path:
    return Path(root) / f"{mode}.rank{rank}.pt"


def full_worker(rank: int, world: int, root: str) -> dict:
    out = {}
    for mode, options in MODES.items():
        model, opt = _build(options, None)
        losses = _train(model, opt, rank, 0, HALF)
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, _path(root, mode, rank))
        plan = opt.engine.plan.fingerprint
        losses += _train(model, opt, rank, HALF, STEPS)
        # the final state stays on disk (tensors through the result queue need the worker alive)
        torch.save({"losses": losses, "params": params_of(model.module), "plan": plan},
                   _path(root, mode + ".final", rank))
        out[mode] = {"codecs": sorted(set(opt.engine.plan.compression or ["none"]))}
    return out


def resumed_worker(rank: int, world: int, root: str) -> dict:
    out = {}
    for mode, options in MODES.items():
        saved = torch.load(_path(root, mode, rank), weights_only=True)
        model, opt = _build(options, saved["model"])
        opt.load_state_dict(saved["optimizer"])
        profiling, plan = opt.engine.controller.profiling, opt.engine.plan.fingerprint
        losses = _train(model, opt, rank, HALF, STEPS)
        full = torch.load(_path(root, mode + ".final", rank), weights_only=True)
        pairs = list(zip(full["params"], params_of(model.module)))
        out[mode] = {"losses": losses, "full_losses": full["losses"], "plan": plan, "full_plan": full["plan"],
                     "profiling_after_load": profiling, "same_params": all(torch.equal(a, b) for a, b in pairs),
                     "max_param_diff": max(float((a - b).abs().max()) for a, b in pairs)}
    # a plan torch DDP ran (DDP's schedule won the overlap trial): handed to torch DDP again at
    # once; uncompressed, two ranks' sums do not depend on who reduces them
    saved = torch.load(_path(root, "none", rank), weights_only=True)
    adaptive = saved["optimizer"]["caramel_adaptive"]
    adaptive["plan"] = {**adaptive["plan"], "ddp": True, "overlap": "backward"}
    model, opt = _build({}, saved["model"])
    opt.load_state_dict(saved["optimizer"])
    delegating = opt.engine.delegating
    losses = _train(model, opt, rank, HALF, STEPS)
    full = torch.load(_path(root, "none.final", rank), weights_only=True)
    out["ddp"] = {"delegating_after_load": delegating, "same_losses": losses == full["losses"][HALF:],
                  "same_params": all(torch.equal(a, b) for a, b in zip(full["params"], params_of(model.module)))}
    # a plan saved for other options is not adopted: the run says so and profiles again
    saved = torch.load(_path(root, "topk", rank), weights_only=True)
    model, opt = _build({"compression": "topk:0.2"}, saved["model"])
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        opt.load_state_dict(saved["optimizer"])
    out["other_options"] = {"profiling_after_load": opt.engine.controller.profiling, "said": said.getvalue()}
    return out
