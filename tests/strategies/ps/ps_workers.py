"""Worker functions of the ps strategy's multi-process tests (spawned; must be importable)."""
from __future__ import annotations

import copy
import time

import torch

import caramel
from caramel.strategies.ps.hierarchy import NodeSums
from tests.distributed.workers import FAMILIES, OPTIMIZERS, batch, fresh, make_optimizer, max_diff, params_of, train
from tests.strategies.ps.staleness_workers import pace_worker, predict_resume_worker  # imported from here by tests
from tests.strategies.ps.wire_log import wire_logged

__all__ = ["HIER_RUNS", "behaviour_worker", "checkpoint_worker", "clip_worker", "dead_peer_worker", "fusion_worker",
           "hierarchical_worker", "no_sync_bn_worker", "pace_worker", "parity_worker", "predict_resume_worker",
           "push_traffic_worker", "sent_pulls", "ssp_buffers_worker", "train_clipped"]


def _ps(family: str, opt_kind: str, steps: int, rank: int, spec: str, **kw):
    w = fresh(family)
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer(opt_kind, m.parameters())
    model, opt = caramel.parallelize(m, opt, spec, **kw)
    train(model, opt, sched, w.loss_fn, family, rank, steps)
    opt.synchronize()
    return model, opt


def parity_worker(rank: int, world: int, steps: int, specs: tuple[str, ...], families: tuple[str, ...] = tuple(FAMILIES)) -> dict:
    """Every family x optimizer (LR scheduler included) under each ps spec, against DDP."""
    out = {}
    for family in families:
        for opt_kind in OPTIMIZERS:
            w = fresh(family)
            ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=(family == "mlp_unused"))
            ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
            train(ddp, ropt, rsched, w.loss_fn, family, rank, steps)
            ref = params_of(ddp.module)
            for spec in specs:
                model, opt = _ps(family, opt_kind, steps, rank, spec)
                out[(family, opt_kind, spec)] = max_diff(ref, params_of(model.module))
                out[(family, opt_kind, spec, "moved")] = max_diff(params_of(w.model), params_of(model.module))
                out[(family, opt_kind, spec, "state")] = len(opt.state)
                # BatchNorm statistics as DDP leaves them (sent at step(), ahead of the pulls, under bsp)
                if list(ddp.module.buffers()):
                    out[(family, opt_kind, spec, "buffers")] = max_diff([b.double() for b in ddp.module.buffers()],
                                                                        [b.double() for b in model.module.buffers()])
                sync = opt.ps.buffer_sync
                out[(family, opt_kind, spec, "early")] = sync.early_taken if sync is not None else -1
            caramel.shutdown()
    return out



def _numpy(model) -> list:
    return [t.numpy() for t in params_of(model.module)]


def behaviour_worker(rank: int, world: int, steps: int, specs: tuple[str, ...], slow_rank_s: float) -> dict:
    """Per spec, on the tied transformer with Adam: the recorded wire (send) order of every
    update and the plan's, the owners, staleness per step, stats and the final parameters.
    Specs ending in "+slow" run with rank 1 sleeping `slow_rank_s` before every step. The
    sender's broadcasts on the real gloo groups are logged (`wire_log.py`)."""
    import time

    out = {}
    for spec in specs:
        name, slow = spec.removesuffix("+slow"), spec.endswith("+slow")
        w = fresh("gpt_tied")
        opt, sched = make_optimizer("adam", w.model.parameters())
        with wire_logged() as wire:
            model, opt = caramel.parallelize(w.model, opt, name)
            for step in range(steps):
                if slow and rank == 1:
                    time.sleep(slow_rank_s)
                x, y = batch("gpt_tied", step, rank)
                w.loss_fn(model(x), y).backward()
                opt.step()
                sched.step()
                opt.zero_grad()
            staleness = list(opt.ps.engine.staleness() for _ in range(1))
            try:
                opt.state_dict()
                early_state_error = None
            except caramel.CaramelError as e:
                early_state_error = str(e)
            opt.synchronize()
            run = opt.ps
            plan = run.engine.plan
            mine = [b for u, _ in run.engine.send_log for b in plan.bucket_pull_at(u)
                    if run.engine.server_of(plan.pull_buckets[b][0]) == run.engine.rank]
            out[spec] = {"sent": list(run.engine.send_log), "expected": [plan.pull_order_at(u) for u, _ in run.engine.send_log],
                         "issued": list(run.engine.sender.issued), "mine_expected": mine, "owner": dict(plan.owner), "stats": run.stats_dict(), "params": _numpy(model),
                         "state_entries": len(opt.state_dict()["state"]), "early_state_error": early_state_error,
                         "lag_before_sync": staleness[0], "wire": wire}
            caramel.shutdown()
    return out


def checkpoint_worker(rank: int, world: int, steps: int, spec: str) -> dict:
    """Train 2*steps at once, or steps, checkpoint (state_dict on rank 0 only, as `caramel
    train` does), resume into a fresh model and optimizer on every rank, and steps more."""
    import torch.distributed as dist

    def run(model, opt, sched, w, first):
        train(model, opt, sched, w.loss_fn, "gpt_tied", rank, steps, first=first)

    w = fresh("gpt_tied")
    opt, sched = make_optimizer("adamw", w.model.parameters())
    try:  # first, rank 1 asks for another order than rank 0: one clear error on every rank
        caramel.parallelize(w.model, opt, spec if rank == 0 else spec + ":order=tic")
        mismatch = None
    except caramel.CaramelError as e:
        mismatch = str(e)
    ref, opt = caramel.parallelize(w.model, opt, spec)
    run(ref, opt, sched, w, 0)
    run(ref, opt, sched, w, steps)
    opt.synchronize()
    w2 = fresh("gpt_tied")
    opt2, sched2 = make_optimizer("adamw", w2.model.parameters())
    model, opt2 = caramel.parallelize(w2.model, opt2, spec)
    run(model, opt2, sched2, w2, 0)
    opt2.synchronize()
    saved = [None]
    if rank == 0:
        saved = [{"model": copy.deepcopy(model.module.state_dict()), "opt": copy.deepcopy(opt2.state_dict()),
                  "sched": sched2.state_dict()}]
    dist.broadcast_object_list(saved, src=0)
    w3 = fresh("gpt_tied")
    opt3, sched3 = make_optimizer("adamw", w3.model.parameters())
    w3.model.load_state_dict(saved[0]["model"])
    resumed, opt3 = caramel.parallelize(w3.model, opt3, spec)
    opt3.load_state_dict(saved[0]["opt"])
    sched3.load_state_dict(saved[0]["sched"])
    run(resumed, opt3, sched3, w3, steps)
    opt3.synchronize()
    out = {"diff": max_diff(params_of(ref.module), params_of(resumed.module)),
           "moved": max_diff(params_of(fresh("gpt_tied").model), params_of(resumed.module)),
           "saved_state_entries": len(saved[0]["opt"]["state"]),
           "params": len(list(resumed.module.parameters())), "mismatch": mismatch}
    caramel.shutdown()
    return out


def dead_peer_worker(rank: int, world: int, timeout_s: float) -> dict:
    """Rank 1 stops taking part after 4 steps (its process stays, silent); rank 0's next step
    must fail within the timeout instead of hanging."""
    import time

    w = fresh("cnn_bn")
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, "ps", timeout_s=timeout_s)
    train(model, opt, sched, w.loss_fn, "cnn_bn", rank, 4)
    if rank == 1:
        time.sleep(timeout_s + 2.5)
        return {"error": None}
    t0 = time.monotonic()
    try:
        train(model, opt, sched, w.loss_fn, "cnn_bn", rank, 4)
        opt.synchronize()
        return {"error": None, "elapsed_s": time.monotonic() - t0}
    except RuntimeError as e:
        return {"error": str(e)[:300], "elapsed_s": time.monotonic() - t0}


def sent_pulls(engine) -> dict:
    """What this rank's ordered senders handed to the backend (None: no sender here) beside the
    plan's pull order of every update its engine applied, and each pull bucket's shard."""
    plan = engine.plan
    issued = {name: list(s.issued) if s is not None else None
              for name, s in (("issued", engine.sender), ("relayed", engine.relay_sender))}
    return {**issued, "at": {u: list(plan.bucket_pull_at(u)) for u, _ in engine.send_log},
            "owner": [plan.pull_owner(b) for b in range(len(plan.pull_buckets))]}


HIER_RUNS = (("cnn_bn", "ps:hierarchical=true"), ("gpt_tied", "ps:hierarchical=true"),
             ("gpt_tied", "ps:hierarchical=true,bucket_cap_mb=0"),
             ("gpt_tied", "ps:hierarchical=true,order=random,bucket_cap_mb=0"))


def hierarchical_worker(rank: int, world: int, steps: int, local: int) -> dict:
    """Nodes of `local` ranks: ps with hierarchical aggregation against DDP (BatchNorm CNN and
    tied transformer, fused and per tensor, TAC and random order), and with ssp:2; owners are
    the nodes' first ranks. Per run, the leaders' ordered senders' records and the wire log."""
    import os

    os.environ["LOCAL_WORLD_SIZE"] = str(local)
    out = {}
    refs = {}
    for family, spec in HIER_RUNS:
        if family not in refs:
            w = fresh(family)
            ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
            ropt, rsched = make_optimizer("adam", ddp.parameters())
            train(ddp, ropt, rsched, w.loss_fn, family, rank, steps)
            refs[family] = params_of(ddp.module)
        with wire_logged() as wire:
            model, opt = _ps(family, "adam", steps, rank, spec)
            e = opt.ps.engine
            out[(family, spec, "diff")] = max_diff(refs[family], params_of(model.module))
            out[(family, spec, "servers")] = sorted(set(e.server_ranks().values()))
            out[(family, spec, "sent")] = [o for _, o in e.send_log]
            out[(family, spec, "expected")] = [e.plan.pull_order_at(u) for u, _ in e.send_log]
            out[(family, spec, "pulls")] = sent_pulls(e)
            caramel.shutdown()
        out[(family, spec, "wire")] = wire
    model, opt = _ps("gpt_tied", "adam", steps, rank, "ps:hierarchical=true,consistency=ssp_2")
    out["ssp_params"] = [t.numpy() for t in params_of(model.module)]
    out["ssp_staleness"] = opt.ps.stats_dict()["staleness"]
    caramel.shutdown()
    out["forwarded"] = forwarded_before_step("gpt_tied", rank, 3, "ps:hierarchical=true,bucket_cap_mb=0")
    # the path off gloo (NCCL's: the leaders' reduce, issued at each hook and at step()), run on gloo
    sends = NodeSums.__dict__["sends_point_to_point"]  # the staticmethod itself, to restore as it was
    NodeSums.sends_point_to_point = staticmethod(lambda h: False)
    try:
        model, opt = _ps("cnn_bn", "adam", steps, rank, "ps:hierarchical=true")
        out["threadless_diff"] = max_diff(refs["cnn_bn"], params_of(model.module))
        out["threadless_sender"] = opt.ps.engine.node_sums.sender
        caramel.shutdown()
    finally:
        NodeSums.sends_point_to_point = sends
    return out


def forwarded_before_step(family: str, rank: int, steps: int, spec: str, patience_s: float = 10.0) -> list[dict]:
    """Hierarchical: per step, after backward and before `step()` is called, the buckets whose
    node sum this rank sends to another server (the plan's), those it handed over, those whose
    send completed within `patience_s` (polled; `step()` not called meanwhile), whether each
    send went on this leader's own pull group, how many buckets it serves, and for each
    receive it posted during the step's backward, how many of this step's gradients were
    ready on this rank when it was posted (`posted_at_ready`)."""
    import torch.distributed as dist

    w = fresh(family)
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("adam", m.parameters())
    model, opt = caramel.parallelize(m, opt, spec)
    out = []
    posted_at_ready: list[int] = []
    real_irecv = dist.irecv

    def irecv(tensor, *args, **kw):
        posted_at_ready.append(len(opt.ps.engine.ready))
        return real_irecv(tensor, *args, **kw)

    for step in range(steps):
        x, y = batch(family, step, rank)
        posted_at_ready.clear()
        dist.irecv = irecv
        try:
            w.loss_fn(model(x), y).backward()
        finally:
            dist.irecv = real_irecv
        e = opt.ps.engine  # the engine of this step (a re-plan after the profile makes a new one)
        expected = sorted(b for b, members in enumerate(e.plan.buckets)
                          if e.hier.is_leader and e.server_of(members[0]) != e.rank)
        served = sum(e.server_of(members[0]) == e.rank for members in e.plan.buckets)
        forwards = list(getattr(e.current, "forwards", []))
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline and not all(item.is_completed() for _, item in forwards):
            time.sleep(0.005)
        own_pull = e.hier.lead_pull[e.rank // e.hier.local_size] if e.hier.is_leader else None
        out.append({"expected": expected, "handed": sorted(b for b, _ in forwards),
                    "sent": sorted(b for b, item in forwards if item.is_completed()),
                    "on_own_pull_group": [item.group is own_pull for _, item in forwards],
                    "served": served, "posted_at_ready": list(posted_at_ready)})
        opt.step()
        sched.step()
        opt.zero_grad()
    caramel.shutdown()
    return out


def train_clipped(model, opt, sched, loss_fn, family: str, rank: int, steps: int, clip_here: float) -> int:
    """`train` with torch's clip_grad_norm_(clip_here) after each backward (0: none, the
    servers clip); returns how many steps the norm exceeded `clip_here`."""
    clipped = 0
    for step in range(steps):
        x, y = batch(family, step, rank)
        loss_fn(model(x), y).backward()
        if clip_here:
            clipped += int(torch.nn.utils.clip_grad_norm_(model.parameters(), clip_here) > clip_here)
        opt.step()
        sched.step()
        opt.zero_grad()
    return clipped


def clip_worker(rank: int, world: int, steps: int, cases: tuple[tuple[str, str, str, float], ...]) -> dict:
    """Per (family, optimizer, spec, max norm): ps with the servers clipping against DDP with
    torch.nn.utils.clip_grad_norm_ after each backward."""
    out = {}
    for family, opt_kind, spec, max_norm in cases:
        w = fresh(family)
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
        ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
        out[(spec, "clipped")] = train_clipped(ddp, ropt, rsched, w.loss_fn, family, rank, steps, max_norm)
        m = copy.deepcopy(w.model)
        opt, sched = make_optimizer(opt_kind, m.parameters())
        model, opt = caramel.parallelize(m, opt, spec)
        train_clipped(model, opt, sched, w.loss_fn, family, rank, steps, 0.0)
        opt.synchronize()
        out[spec] = max_diff(params_of(ddp.module), params_of(model.module))
        caramel.shutdown()
    return out


def fusion_worker(rank: int, world: int, steps: int, cases: tuple[tuple[str, str, str], ...]) -> dict:
    """Per (family, optimizer, spec): the final parameters after `steps` steps (LR scheduler
    included), the plan's buckets and owners, and what went on the wire per update."""
    out = {}
    for family, opt_kind, spec in cases:
        model, opt = _ps(family, opt_kind, steps, rank, spec)
        plan = opt.ps.engine.plan
        out[(family, opt_kind, spec)] = {
            "params": _numpy(model), "buckets": [list(b) for b in plan.buckets], "owner": dict(plan.owner),
            "trainable": list(plan.params), "sent": list(opt.ps.engine.send_log),
            "expected": [plan.pull_order_at(u) for u, _ in opt.ps.engine.send_log],
            "stats_buckets": opt.ps.stats_dict()["buckets"]}
        caramel.shutdown()
    return out


def push_traffic_worker(rank: int, world: int, steps: int) -> dict:
    """Colocated bsp, one tensor per bucket: every point-to-point operation and reduce handed
    to a push or pull group during `steps` steps of the MLP with unused parameters and SGD
    momentum (op, "push" or "pull", the group's shard, the peer's group rank, bytes), and the
    largest difference from DDP's parameters; for each receive, how many of this step's
    gradients were ready on this rank when it was posted (`posted_at_ready`). `late`: the
    same with the receives posted at the server's own push (the path off gloo), run on gloo."""
    from caramel.strategies.ps.engine import PsEngine

    w = fresh("mlp_unused")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=True)
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    train(ddp, ropt, rsched, w.loss_fn, "mlp_unused", rank, steps)
    ref = params_of(ddp.module)
    out = _push_traffic(w, ref, rank, steps)
    early = PsEngine.__dict__["posts_receives_early"]  # the staticmethod itself, to restore as it was
    PsEngine.posts_receives_early = staticmethod(lambda groups: False)
    try:
        out["late"] = _push_traffic(w, ref, rank, steps)
    finally:
        PsEngine.posts_receives_early = early
    return out


def _push_traffic(w, ref: list, rank: int, steps: int) -> dict:
    import torch.distributed as dist

    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("sgd_momentum", m.parameters())
    model, opt = caramel.parallelize(m, opt, "ps:bucket_cap_mb=0")
    groups = opt.ps.groups
    kind = {id(g): ("push", s) for s, g in enumerate(groups.push)}
    kind.update({id(g): ("pull", s) for s, g in enumerate(groups.pull)})
    seen: list[tuple[str, str, int, int | None, int]] = []
    posted_at_ready: list[int] = []
    real = {n: getattr(dist, n) for n in ("isend", "irecv", "reduce")}

    def spy(name):
        def call(tensor, *args, group=None, **kw):
            if id(group) in kind:
                peer = args[0] if args else kw.get("dst", kw.get("src"))
                seen.append((name, *kind[id(group)], dist.get_group_rank(group, peer),
                             tensor.numel() * tensor.element_size()))
                if name == "irecv":
                    posted_at_ready.append(len(opt.ps.engine.ready))
            return real[name](tensor, *args, group=group, **kw)
        return call

    for n in real:
        setattr(dist, n, spy(n))
    try:
        train(model, opt, sched, w.loss_fn, "mlp_unused", rank, steps)
        opt.synchronize()
    finally:
        for n, f in real.items():
            setattr(dist, n, f)
    out = {"seen": seen, "posted_at_ready": posted_at_ready, "diff": max_diff(ref, params_of(model.module))}
    caramel.shutdown()
    return out


def no_sync_bn_worker(rank: int, world: int, steps: int, spec: str) -> dict:
    """cnn_bn with a micro-batch accumulated under no_sync every third step (`_train_messy`, no
    clipping), against DDP: DDP broadcasts buffers only at a forward that follows a synchronized
    training forward, so the forward after a no_sync one takes none."""
    from tests.distributed.workers import _train_messy

    w = fresh("cnn_bn")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    _train_messy(ddp, ropt, rsched, w.loss_fn, "cnn_bn", rank, steps, clip=lambda *a: None)
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, spec, timeout_s=20)
    _train_messy(model, opt, sched, w.loss_fn, "cnn_bn", rank, steps, clip=lambda *a: None)
    opt.synchronize()
    out = {"diff": max_diff(params_of(ddp.module), params_of(model.module)),
           "buffers": max_diff([b.double() for b in ddp.module.buffers()], [b.double() for b in model.module.buffers()])}
    caramel.shutdown()
    return out


def ssp_buffers_worker(rank: int, world: int, steps: int, broadcast_buffers: bool) -> list:
    """cnn_bn under ssp:2, each rank its own batches; the buffers each rank holds after synchronize()."""
    w = fresh("cnn_bn")
    opt, _ = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, "ps:consistency=ssp:2", broadcast_buffers=broadcast_buffers,
                                     timeout_s=20)
    for step in range(steps):
        x, y = batch("cnn_bn", step, rank)
        opt.zero_grad()
        w.loss_fn(model(x), y).backward()
        opt.step()
    opt.synchronize()
    out = [b.double().tolist() for b in model.module.buffers()]
    caramel.shutdown()
    return out
