"""Worker functions of the ps strategy's multi-process tests (spawned; must be importable)."""
from __future__ import annotations

import copy

import numpy as np
import torch

import caramel
from tests.distributed.workers import FAMILIES, OPTIMIZERS, batch, fresh, make_optimizer, max_diff, params_of, train
from tests.strategies.ps.wire_log import wire_logged


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
        for step in range(first, first + steps):
            x, y = batch("gpt_tied", step, rank)
            w.loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
            opt.zero_grad()

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


def pace_worker(rank: int, world: int, steps: int, specs: tuple[str, ...], slow_rank_s: float,
                sgd_specs: tuple[str, ...] = ()) -> dict:
    """Per spec, rank 1 sleeping `slow_rank_s` before every step under ssp:S, S > 0: when each
    forward of this rank began (after the strategy's own waits: a pre-hook on the inner model)
    and when each step() was called (perf_counter, one clock for every process of the machine),
    the staleness log, the final parameters, (predict) what each forward used, and per update
    this rank's servers stepped: the lr inside the optimizer's step and the gradients and values
    it stepped. Adam, except plain SGD for `sgd_specs` (its step is checkable by hand)."""
    import time

    from caramel.strategies.ps.buckets import unflatten
    from caramel.strategies.ps.compensate import DelayCompensation
    from caramel.strategies.ps.engine import PsEngine
    from caramel.strategies.ps.staleness import StalenessControl

    unlogged, unrated, uncompensated = DelayCompensation.bucket, PsEngine._step_shard, StalenessControl.compensate
    out = {}
    for spec in specs:
        server_steps: list[dict] = []  # per update this rank's servers stepped: what the optimizer's step saw
        keep_values = spec in sgd_specs  # the gradients and values too (the others: the lr only)

        def rated(engine, idx, u, server_steps=server_steps, keep_values=keep_values):
            if not idx:
                return unrated(engine, idx, u)
            opt_ = engine.optimizer
            rec = {"step": u.step, "lr_now": float(opt_.param_groups[0]["lr"]), "params": {}}
            inner = opt_._caramel_inner_step

            def stepped():  # inside step_shard: the lr and gradients the optimizer's step runs with
                rec["lr"] = float(opt_.param_groups[0]["lr"])
                before = {i: engine.params[i].detach().numpy().copy() for i in idx} if keep_values else {}
                inner()
                if keep_values:
                    rec["params"] = {i: (engine.params[i].grad.numpy().copy(), before[i],
                                         engine.params[i].detach().numpy().copy()) for i in idx}
            opt_._caramel_inner_step = stepped
            try:
                unrated(engine, idx, u)
            finally:
                opt_._caramel_inner_step = inner
            server_steps.append(rec)
        PsEngine._step_shard = rated  # the engine is rebuilt after profiling: on the class
        scale_log: list[dict] = []  # scale: per bucket this rank served, each worker's lag and part before/after

        def logged_scale(control, step, b, flat, parts, used, scale_log=scale_log):
            if not control.scaling:
                return uncompensated(control, step, b, flat, parts, used)
            e = control.e
            members = e.plan.buckets[b]
            ranks = [e.rank] + [j for j in range(e.workers) if j != e.rank]
            pos = {i: k for k, i in enumerate(e.plan.params)}

            def values():
                return [[v.detach().numpy().copy() for v in unflatten(t, [e.params[i] for i in members])]
                        for t in [flat] + parts]
            pre = values()
            uncompensated(control, step, b, flat, parts, used)
            post = values()
            scale_log.append({"step": step, "ranks": ranks, "params": {
                i: ([control.lags[r][pos[i]] for r in ranks], used[i], [x[k] for x in pre], [x[k] for x in post])
                for k, i in enumerate(members)}})
        StalenessControl.compensate = logged_scale
        w = fresh("gpt_tied")
        if spec in sgd_specs:
            opt = torch.optim.SGD(w.model.parameters(), lr=0.05)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
        else:
            opt, sched = make_optimizer("adam", w.model.parameters())
        forward_at: list[float] = []
        w.model.register_forward_pre_hook(lambda _m, _a: forward_at.append(time.perf_counter()))
        model, opt = caramel.parallelize(w.model, opt, spec)
        version_at: dict[int, dict[int, int]] = {}  # per step: each parameter's version its forward used

        def versions(_m, _a, _out):
            e = opt.ps.engine
            if torch.is_grad_enabled():
                version_at[e.steps] = dict(e.version)
        w.model.register_forward_hook(versions)
        paced: list[int] = []  # pace: per forward, the updates it applied before the forward ran

        def counted(control, pace=StalenessControl.pace, paced=paced):
            before = len(control.e.pending)
            waited = pace(control)
            paced.append(before - len(control.e.pending))
            return waited
        StalenessControl.pace = counted  # the engine is rebuilt after profiling: count on the class
        seen: list[dict] = []  # predict: per training forward, each parameter's version, value used and true value
        if "predict" in spec:
            def record(_m, _a, _out):
                e = opt.ps.engine
                if torch.is_grad_enabled() and not opt.ps.profiling and e.stale is not None:
                    seen.append({i: (e.version[i], e.steps, e.params[i].detach().numpy().copy(),
                                     e.stale.base.get(i, e.params[i]).detach().numpy().copy()) for i in e.plan.params})
            w.model.register_forward_hook(record)
        used_at: dict[int, dict[int, np.ndarray]] = {}  # compensate: per step, the values its forward used
        served: list[dict] = []  # compensate: per bucket this rank corrected, what each worker's drift was
        if "compensate" in spec:
            def keep(_m, _a, _out):
                e = opt.ps.engine
                if torch.is_grad_enabled() and not opt.ps.profiling:
                    used_at[e.steps] = {i: e.params[i].detach().numpy().copy() for i in e.plan.params}
            w.model.register_forward_hook(keep)
            DelayCompensation.bucket = _logged_bucket(served)  # the engine is rebuilt after profiling: on the class
        step_at, step_lr = [], []  # per step: when step() was called, the scheduler's lr then
        grad_at: list[dict[int, np.ndarray]] = []  # per step: this worker's gradients (before the 1 / workers)
        for step in range(steps):
            if rank == 1 and "ssp:0" not in spec and ":" in spec:
                time.sleep(slow_rank_s)
            x, y = batch("gpt_tied", step, rank)
            w.loss_fn(model(x), y).backward()
            step_at.append(time.perf_counter())
            step_lr.append(float(opt.param_groups[0]["lr"]))
            e = opt.ps.engine
            if keep_values:
                grad_at.append({i: (e.params[i].grad.numpy().copy() if e.params[i].grad is not None
                                    else np.zeros(tuple(e.params[i].shape), np.float32)) for i in e.plan.params})
            opt.step()
            sched.step()
            opt.zero_grad()
        opt.synchronize()
        StalenessControl.pace = counted.__defaults__[0]
        DelayCompensation.bucket = unlogged
        PsEngine._step_shard = unrated
        StalenessControl.compensate = uncompensated
        dc = opt.ps.engine.stale.dc if opt.ps.engine.stale is not None else None
        buckets = [list(b) for b in opt.ps.engine.plan.buckets]
        served[:] = [x for x in served if x.pop("dc") is dc]  # the engine after profiling (another plan before)
        for entry in served:
            entry["bucket"] = buckets.index(entry.pop("members"))
        out[spec] = {"forward_at": forward_at, "step_at": step_at, "params": _numpy(model), "seen": seen, "paced": paced,
                     "staleness": opt.ps.stats_dict()["staleness"], "pace_wait_s": opt.ps.stats_dict()["pace_wait_s"],
                     "lr_scaled": opt.ps.stats_dict()["lr_scaled"],
                     "updates_applied": opt.ps.stats_dict()["updates_applied"], "server_steps": server_steps, "step_lr": step_lr,
                     "scale_log": scale_log, "version_at": version_at, "grad_at": grad_at,
                     "dc": None if dc is None else {"served": served, "used_at": used_at, "corrected": dc.corrected,
                                                    "missing": dc.missing, "buckets": len(buckets)}}
        caramel.shutdown()
    return out


def _logged_bucket(served: list[dict]):
    """`DelayCompensation.bucket` that also logs, per call, the update, the bucket's members,
    and per worker position (the server's own push first, then the others in rank order) and
    used parameter: the lag and the drift the server computed (None: lag 0), with w_now."""
    from caramel.strategies.ps.compensate import DelayCompensation

    bucket, drift = DelayCompensation.bucket, DelayCompensation.drift

    def logged(self, members, views, lags, params, version_now, used, workers):
        calls = []

        def logged_drift(i, now, version, lag):
            d = drift(self, i, now, version, lag)
            calls.append((i, lag, now.detach().numpy().copy(), None if d is None else d.numpy().copy()))
            return d
        self.drift = logged_drift
        try:
            bucket(self, members, views, lags, params, version_now, used, workers)
        finally:
            del self.drift
        # bucket() asks for the drifts parameter by parameter, each worker in position order
        entry = {"dc": self, "step": version_now, "members": list(members), "lags": [list(x) for x in lags], "drifts": []}
        for n, (i, lag, now, d) in enumerate(calls):
            entry["drifts"].append((n % len(lags), i, lag, now, d))
        served.append(entry)
    return logged


def predict_resume_worker(rank: int, world: int, steps: int, spec: str) -> dict:
    """(staleness=predict or compensate) `steps` steps uninterrupted, checkpointed at steps // 2 (rank 0's state dicts through
    torch.save / torch.load(weights_only=True), as `caramel train` does), against fresh model,
    optimizer and engine objects loaded from that checkpoint: the staleness state, the plan and
    step count at the resume point, and what a forward one update behind would compute on
    (`probe`: the extrapolation the restored state makes, deterministic, unlike the timing of
    which pulls have landed that decides it in a run)."""
    import io

    import torch.distributed as dist

    from caramel.strategies.ps.compensate import compensated
    from caramel.strategies.ps.parallelize import PsRun

    half = steps // 2

    def run(model, opt, sched, w, first, n):
        for step in range(first, first + n):
            x, y = batch("gpt_tied", step, rank)
            w.loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
            opt.zero_grad()

    def state(opt) -> dict:
        e = opt.ps.engine
        dc = e.stale.dc.mean_sq if e.stale.dc is not None else {}
        return {"steps": e.steps, "plan": e.plan.to_dict(), "profiling": opt.ps.profiling,
                "versions": sorted(set(e.version.values())), "peer_busy_s": list(e.stale.peer_busy_s),
                # numpy: tensors cross the result queue through shared memory, gone once a worker exits
                "delta": {e.names[i]: d.detach().numpy().copy() for i, d in e.stale.delta.items()},
                "dc_mean_sq": {e.names[i]: m.numpy().copy() for i, m in dc.items()},
                "served": sorted(e.names[i] for i in e.plan.params if e.server_of(i) == e.rank)}

    def probe(opt, restored: bool = True) -> list[torch.Tensor]:
        e = opt.ps.engine
        if e.stale.dc is not None:  # the next correction this server makes: a made-up push one update behind
            dc, out = e.stale.dc, []
            for i in sorted(dc.mean_sq):
                parts = [e.params[i].detach() * 0.01, e.params[i].detach() * -0.02]
                compensated(parts, [None, torch.full_like(parts[1], 1e-3)],
                            dc.mean_sq[i].clone() if restored else None, dc.lambda0, 2)
                out.append(parts[1])
            return out
        e.steps += 1  # every parameter lacks one update: a forward would use w + delta
        try:
            with torch.no_grad():
                e.stale._extrapolate(e.plan.params)
            out = [e.params[i].detach().clone() for i in e.plan.params]
            e.stale.restore(e.plan.params)
        finally:
            e.steps -= 1
        return out

    replans: list[dict] = []  # compensate: this rank's running mean squares before and after the new plan

    def adopting(run, profile, adopt=PsRun._adopt_plan):
        names, before = run.engine.names, run.engine.stale.dc
        replans.append({"before": {names[i]: m.numpy().copy() for i, m in (before.mean_sq if before else {}).items()}})
        adopt(run, profile)
        after = run.engine.stale.dc
        replans[-1]["after"] = {names[i]: m.numpy().copy() for i, m in (after.mean_sq if after else {}).items()}
    PsRun._adopt_plan = adopting
    w = fresh("gpt_tied")
    opt, sched = make_optimizer("adam", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, spec)
    run(model, opt, sched, w, 0, half)
    PsRun._adopt_plan = adopting.__defaults__[0]
    opt.synchronize()
    saved = [None]
    if rank == 0:
        buf = io.BytesIO()
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
        saved = [buf.getvalue()]
    dist.broadcast_object_list(saved, src=0)
    full_at, full_probe = state(opt), probe(opt)
    unrestored_probe = probe(opt, restored=False) if opt.ps.engine.stale.dc is not None else full_probe
    true_values = [p.detach().clone() for p in model.module.parameters()]
    run(model, opt, sched, w, half, steps - half)
    opt.synchronize()
    full_end = opt.ps.engine.plan.to_dict()

    ckpt = torch.load(io.BytesIO(saved[0]), weights_only=True)
    w2 = fresh("gpt_tied")
    opt2, sched2 = make_optimizer("adam", w2.model.parameters())
    w2.model.load_state_dict(ckpt["model"])
    resumed, opt2 = caramel.parallelize(w2.model, opt2, spec)
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])
    resumed_at, resumed_probe = state(opt2), probe(opt2)
    # a checkpoint from before the entry existed: loads, and the run profiles as it always did
    w3 = fresh("gpt_tied")
    opt3, _ = make_optimizer("adam", w3.model.parameters())
    _, opt3 = caramel.parallelize(w3.model, opt3, spec)
    opt3.load_state_dict({k: v for k, v in ckpt["opt"].items() if k != "caramel_ps"})
    older = {"profiling": opt3.ps.profiling, "steps": opt3.ps.engine.steps}
    run(resumed, opt2, sched2, w2, half, steps - half)
    opt2.synchronize()
    out = {
        "full_at": full_at, "resumed_at": resumed_at,
        "same_probe": all(torch.equal(a, b) for a, b in zip(full_probe, resumed_probe)),
        "probe_moves": max(float((a - b).abs().max()) for a, b in zip(full_probe, true_values))
        if opt.ps.engine.stale.predicting else None,
        "probe_needs_state": any(not torch.equal(a, b) for a, b in zip(full_probe, unrestored_probe)),
        "probed": len(full_probe),
        "full_end_plan": full_end, "resumed_end_plan": opt2.ps.engine.plan.to_dict(),
        "resumed_end_steps": opt2.ps.engine.steps, "resumed_profiled": opt2.ps.profiling,
        "params": _numpy(resumed), "older": older, "replans": replans,
    }
    caramel.shutdown()
    return out


def push_traffic_worker(rank: int, world: int, steps: int) -> dict:
    """Colocated bsp, one tensor per bucket: every operation handed to a push group during
    `steps` steps of the MLP with unused parameters and SGD momentum (op, the group's shard,
    the peer's group rank, bytes), and the largest difference from DDP's parameters."""
    import torch.distributed as dist

    w = fresh("mlp_unused")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=True)
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    train(ddp, ropt, rsched, w.loss_fn, "mlp_unused", rank, steps)
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("sgd_momentum", m.parameters())
    model, opt = caramel.parallelize(m, opt, "ps:bucket_cap_mb=0")
    groups = opt.ps.groups
    push = {id(g): s for s, g in enumerate(groups.push)}
    seen: list[tuple[str, int, int | None, int]] = []
    real = {n: getattr(dist, n) for n in ("isend", "irecv", "reduce")}

    def spy(name):
        def call(tensor, *args, group=None, **kw):
            if id(group) in push:
                peer = args[0] if args else kw.get("dst", kw.get("src"))
                seen.append((name, push[id(group)], dist.get_group_rank(group, peer), tensor.numel() * tensor.element_size()))
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
    out = {"seen": seen, "diff": max_diff(params_of(ddp.module), params_of(model.module))}
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
