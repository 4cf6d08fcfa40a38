"""Worker functions for the hybrid (data x pipeline) tests (spawned; must be importable)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import caramel
from tests.strategies.pipeline.workers import MICRO, batch, make_model, max_diff, reference, sgd

STEPS = 10


def hybrid_worker(rank: int, world: int, steps: int = STEPS, root: str | None = None) -> dict:
    """stages=2 x replicas=2, each replica on its own batch, against single-process training on
    the whole batch: replica_reduce="ddp" (1f1b, 2 microbatches, SGD with momentum) and "caramel" (gpipe with SGD
    momentum, an optimizer made per stage; 1f1b with Adam, the whole model's optimizer); a
    state-dict save and reload halfway must change nothing. With `root`, also `train_resume`
    there (in the same processes: one spawn for both)."""
    out = {}
    # DDP with 2 microbatches: torch's shape-inference forward through DDP once broke its second step
    configs = {"ddp_1f1b_sgd": ("ddp", "1f1b", "sgd", [3], 2),
               "caramel_gpipe_sgd": ("caramel", "gpipe", "sgd", [3], MICRO),
               "caramel_1f1b_adam": ("caramel", "1f1b", "adam", [5], MICRO)}
    for name, (reduce, schedule, opt, cut, micro) in configs.items():
        model = make_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam" else sgd
        pipe = caramel.pipeline(model, optimizer, stages=2, microbatches=micro, schedule=schedule, partition=cut,
                                replicas=2, replica_reduce=reduce)
        half = steps // 2
        for step in range(half):
            pipe.step(*batch(step, pipe.layout.replica), F.cross_entropy)
        engine = pipe._engine  # None with DDP
        pending = engine is not None and engine.has_pending_updates()  # waits for the next forward
        # the state dict applies what is pending; loading it back changes nothing
        mid = pipe.state_dict()
        pipe.load_state_dict(mid)
        for step in range(half, steps):
            pipe.step(*batch(step, pipe.layout.replica), F.cross_entropy)
        final = pipe.state_dict()
        out[name] = {"diff": max_diff(final, reference(steps, replicas=2, opt=opt)),
                     # controls: training moved on after the reload, and one replica's batch alone
                     # (no reduction) gives other parameters
                     "moved": max_diff(final, mid), "alone_diff": max_diff(final, reference(steps, opt=opt)),
                     "mid_diff": max_diff(mid, reference(half, replicas=2, opt=opt)),
                     "layout": pipe.layout.stage_indices, "pending_after_step": pending}
        if engine is not None:
            out[name].update(steps=engine.stats.step, buckets=len(engine.buckets), planner=engine.plan.planner,
                             world=engine.world_size, reduces=reduce_trace(pipe))
    out["batchnorm"] = batchnorm_buffers()
    out["tied"] = tied_replicas(rank)
    if root is not None:
        out["train"] = train_resume(root, rank)
    return out


def reduce_trace(pipe) -> dict:
    """What the stage timer kept of the engine's reduction: its plan, and per step but the last
    (whose collectives may complete after it is recorded) each collective's bytes and times set
    against the step's last backward of this rank's stage."""
    timer = pipe.timer
    params_bytes = sum(p.numel() * p.element_size() for p in pipe.stage_modules[0].parameters())
    steps = []
    for st in timer.steps[:-1]:
        last_b = max((a for a in st.actions if a[0] == "B"), key=lambda a: a[3])
        steps.append({"bytes": [r[0] for r in st.reduces],
                      "issued_in_last_backward": [last_b[3] <= r[1] <= last_b[4] for r in st.reduces],
                      "done_after_issue": [r[2] >= r[1] for r in st.reduces]})
    return {"plan": [list(x) for x in timer.reduce_plan], "params_bytes": params_bytes, "steps": steps}


def tied_replicas(rank: int, steps: int = STEPS) -> dict:
    """A weight tied between the first and the last layer, split across the 2 stages, 2 replicas
    each on its own batch (replica_reduce="auto" takes DDP for it), gpipe, SGD with momentum, a
    state-dict save and reload halfway; against single-process training on the whole batch.
    Every rank's copy of the tied weight, gathered; replica_reduce="caramel" is refused. (The
    traced GPT case is the sync test's: tracing costs seconds per rank.)"""
    import torch.distributed as dist

    from caramel.errors import CaramelError
    from tests.strategies.pipeline.workers import tied_sequential

    net, ref = tied_sequential(), tied_sequential()
    pipe = caramel.pipeline(net, sgd, stages=2, microbatches=2, schedule="gpipe", partition=[2], replicas=2)
    opt = sgd(ref.parameters())
    for step in range(steps):
        pipe.step(*batch(step, pipe.layout.replica), F.cross_entropy)
        xs, ys = zip(*(batch(step, r) for r in range(2)))
        F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
        opt.zero_grad()
        if step == steps // 2:
            pipe.load_state_dict(pipe.state_dict())
    copies: list = [None] * dist.get_world_size()
    dist.all_gather_object(copies, net[0].weight.detach().clone())
    out = {"diff": max_diff(pipe.state_dict(), ref.state_dict()), "ddp": pipe._engine is None,
           "copies_equal": all(torch.equal(copies[0], c) for c in copies[1:])}
    pipe.close()
    try:
        caramel.pipeline(tied_sequential(), sgd, stages=2, microbatches=2, partition=[2], replicas=2,
                         replica_reduce="caramel").step(*batch(0, rank % 2), F.cross_entropy)
        out["caramel"] = None
    except CaramelError as e:
        out["caramel"] = str(e)
    return out


def batchnorm_buffers(steps: int = 3) -> dict[str, list]:
    """A model with BatchNorm, replica_reduce="caramel": its running statistics after `steps`
    steps (each replica sees its own batch; the replicas must end with the same ones)."""
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 32), nn.BatchNorm1d(32),
                          nn.Tanh(), nn.Linear(32, 10))
    pipe = caramel.pipeline(model, sgd, stages=2, microbatches=MICRO, schedule="1f1b", partition=[3], replicas=2,
                            replica_reduce="caramel")
    for step in range(steps):
        pipe.step(*batch(step, pipe.layout.replica), F.cross_entropy)
    return {k: v.tolist() for m in pipe.stage_modules for k, v in m.named_buffers()}


TRAIN_STRATEGY = "pipeline:stages=2,replicas=2,microbatches=2,schedule=1f1b,partition=4,replica_reduce=caramel"


def train_resume(root: str, rank: int) -> dict | None:
    """`caramel train` on the hybrid with Caramel's replica reduction: 6 steps straight against 3,
    stop, resume, 3 (dropout on). On rank 0 (which writes the checkpoints and the metrics): which
    keys of the final checkpoint differ, and both runs' losses."""
    import json
    from pathlib import Path

    from caramel.train.loop import train
    from tests.train.test_pipeline import STEPS, _cfg, _final_state, _flat

    base = Path(root)
    straight = train(_cfg(base / "straight", TRAIN_STRATEGY))
    train(_cfg(base / "resumed", TRAIN_STRATEGY, run={"stop_after_steps": STEPS // 2}))
    resumed = train(_cfg(base / "resumed", TRAIN_STRATEGY, checkpoint={"resume": "auto"}))
    if rank != 0:
        return None
    a, b = _flat(_final_state(straight)), _flat(_final_state(resumed))
    keys = [k for k in a if k.startswith(("/model", "/optimizer", "/scheduler", "/pipeline"))]
    differ = [k for k in keys if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    rows = {name: map(json.loads, (base / name / "metrics.jsonl").read_text().splitlines())
            for name in ("straight", "resumed")}
    losses = {name: [(r["step"], r["loss"]) for r in rs if r["kind"] == "train"] for name, rs in rows.items()}
    return {"differ": differ, "keys": len(keys), "optimizer_keys": sum(k.startswith("/optimizer/state/") for k in keys),
            "start_step": resumed["start_step"], "losses": losses}
