"""Worker functions of the ps strategy's staleness tests (spawned; must be importable): ssp
pacing with a slow rank, delay compensation's per-bucket log, and predict/compensate state
across a checkpoint resume.

Kept apart from `ps_workers.py` (parity, checkpoints, hierarchy, clipping, fusion) because these
workers patch the engine's and compensation's classes to log what the servers computed;
`ps_workers` re-exports them under their old names.
"""
from __future__ import annotations

import numpy as np
import torch

import caramel
from tests.distributed.workers import batch, fresh, make_optimizer, params_of, train


def _numpy(model) -> list:
    return [t.numpy() for t in params_of(model.module)]


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
        train(model, opt, sched, w.loss_fn, "gpt_tied", rank, n, first=first)

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
