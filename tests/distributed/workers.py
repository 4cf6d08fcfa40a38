"""Worker functions for the multi-process parity tests (spawned; must be importable)."""
from __future__ import annotations

import copy
import functools

import torch
import torch.distributed as dist
import torch.nn as nn

import caramel
from caramel.models import get_model

FAMILIES = {  # name -> (zoo model, per-rank batch, has batch statistics)
    "cnn_bn": ("small_cnn", 4, True),
    "gpt_tied": ("tiny_gpt", 2, False),
    "mlp_unused": ("branchy_mlp", 4, False),
}
OPTIMIZERS = ("sgd_momentum", "adam", "adamw")
OVERLAPS = ("forward", "backward", "none", "auto")


def make_optimizer(kind: str, params) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    if kind == "sgd_momentum":
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    elif kind == "adam":
        # 1e-3, the usual Adam rate: at 1e-2 a 20-step transformer run amplifies rounding
        # differences of another summation order (the single-process reference) past 1e-5
        opt = torch.optim.Adam(params, lr=1e-3)
    else:
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
    return opt, sched


def batch(family: str, step: int, rank: int):
    """This rank's batch at this step: deterministic, different on every rank and step.

    Made by the zoo factory, which also builds (and here discards) a model and seeds torch's
    global generator; a worker asks for the same batch once per run it compares, so the batch
    and the generator's state after it are made once and replayed: copies of the same tensors,
    and the same global generator state as a fresh call leaves."""
    x, y, rng = _batch_made(family, step, rank)
    torch.set_rng_state(rng)
    return x.clone(), y.clone()


@functools.lru_cache(maxsize=None)
def _batch_made(family: str, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    name, bs, _ = FAMILIES[family]
    w = get_model(name)(batch_size=bs, seed=1000 + 31 * step + rank)  # seeds the global generator first
    return w.inputs, w.targets, torch.get_rng_state()


def fresh(family: str):
    name, bs, _ = FAMILIES[family]
    return get_model(name)(batch_size=bs, seed=0)


def train(model, opt, sched, loss_fn, family, rank, steps, world=None, concat=False, first=0):
    """`steps` optimizer steps on the family's batches `first`, `first` + 1, ... (this rank's, or
    every rank's concatenated); `first` lets a resumed run continue the same batch sequence."""
    for step in range(first, first + steps):
        if concat:
            xs, ys = zip(*(batch(family, step, r) for r in range(world)))
            x, y = torch.cat(xs), torch.cat(ys)
        else:
            x, y = batch(family, step, rank)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def parity_worker(rank: int, world: int, planner: str, steps: int, planner_options: dict) -> dict:
    """Every family x optimizer x overlap mode with `planner`, against DDP (and single-process)."""
    out = {}
    for family in FAMILIES:
        for opt_kind in OPTIMIZERS:
            w = fresh(family)
            ref_model = copy.deepcopy(w.model)
            ddp = torch.nn.parallel.DistributedDataParallel(ref_model, find_unused_parameters=(family == "mlp_unused"))
            ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
            train(ddp, ropt, rsched, w.loss_fn, family, rank, steps)
            ref = params_of(ddp.module)
            if not FAMILIES[family][2]:
                single = copy.deepcopy(w.model)
                sopt, ssched = make_optimizer(opt_kind, single.parameters())
                train(single, sopt, ssched, w.loss_fn, family, rank, steps, world=world, concat=True)
                out[(family, opt_kind, "ddp-vs-single")] = max_diff(ref, params_of(single))
            for overlap in OVERLAPS:
                m = copy.deepcopy(w.model)
                opt, sched = make_optimizer(opt_kind, m.parameters())
                # auto: profiling takes 4 steps, then 2 trial steps per block (12), and 8 more
                # when a choice other than the baseline is confirmed, so the 24 steps cross
                # every mode switch and the final choice
                extra = {"trial_steps": 2, "trial_passes": 1} if overlap == "auto" else {}
                model, opt = caramel.parallelize(m, opt, planner=planner, overlap=overlap, **extra, **planner_options)
                train(model, opt, sched, w.loss_fn, family, rank, steps)
                opt.synchronize()
                out[(family, opt_kind, overlap)] = max_diff(ref, params_of(model.module))
                if overlap == "auto":
                    out[(family, opt_kind, overlap, "trial")] = opt.engine.stats.extra.get("overlap_trial")
                if rank == 0:
                    out[(family, opt_kind, overlap, "buckets")] = len(opt.engine.buckets)
    return out


def chunked_plan_worker(rank: int, world: int, steps: int) -> dict:
    """A hand-made plan: small buckets, each cut into 3 chunks, issued need-first (the reverse of
    ready order, so early-ready buckets wait for late ones), for every overlap mode."""
    from caramel.plan.planners import group_by_cap, plan_from_groups, ready_sorted
    from caramel.profile.profiler import profile_model

    out = {}
    for family in ("gpt_tied", "cnn_bn"):
        w = fresh(family)
        prof = profile_model(copy.deepcopy(w.model), w.inputs, w.targets, w.loss_fn, steps=1)
        groups = group_by_cap(ready_sorted(prof), [4096])
        chunks = [min(3, sum(prof.params[i].numel for i in (p.index for p in g))) for g in groups]
        order = [(b, c) for b in reversed(range(len(groups))) for c in range(chunks[b])]
        plan = plan_from_groups("handmade", prof, world, groups, chunks=chunks, order=order)
        ref_model = copy.deepcopy(w.model)
        ddp = torch.nn.parallel.DistributedDataParallel(ref_model)
        ropt, rsched = make_optimizer("adamw", ddp.parameters())
        train(ddp, ropt, rsched, w.loss_fn, family, rank, steps)
        ref = params_of(ddp.module)
        for overlap in OVERLAPS:
            m = copy.deepcopy(w.model)
            opt, sched = make_optimizer("adamw", m.parameters())
            extra = {"trial_steps": 3} if overlap == "auto" else {}
            model, opt = caramel.parallelize(m, opt, plan=plan, overlap=overlap, **extra)
            train(model, opt, sched, w.loss_fn, family, rank, steps)
            opt.synchronize()
            out[(family, overlap)] = max_diff(ref, params_of(model.module))
        out[(family, "items")] = len(plan.order)
        out[(family, "buckets")] = len(plan.buckets)
    return out


def shutdown_worker(rank: int, world: int, steps: int) -> dict:
    """Train with forward overlap, shut down with updates pending: they are applied first
    (parameters equal DDP's), the groups are gone, and a further step is a clear error."""
    w = fresh("cnn_bn")
    ref_model = copy.deepcopy(w.model)
    ddp = torch.nn.parallel.DistributedDataParallel(ref_model)
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    train(ddp, ropt, rsched, w.loss_fn, "cnn_bn", rank, steps)
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("sgd_momentum", m.parameters())
    model, opt = caramel.parallelize(m, opt, overlap="forward")
    train(model, opt, sched, w.loss_fn, "cnn_bn", rank, steps)
    pending = bool(opt.engine.has_pending_updates())
    caramel.shutdown()
    caramel.shutdown()  # idempotent
    out = {"pending_before": pending, "diff": max_diff(params_of(ddp.module), params_of(model.module)),
           "comm_released": opt.engine.comm is None}
    x, y = batch("cnn_bn", 0, rank)
    try:
        w.loss_fn(model(x), y).backward()
        opt.step()
        out["error"] = None
    except caramel.CaramelError as e:
        out["error"] = str(e)
    return out


def measured_cluster_worker(rank: int, world: int, steps: int, queued_probe: bool = True, one_core: bool = False) -> dict:
    """Online profiling without a cluster spec: the plan is made for the latency and bandwidth
    the job measured, and every rank holds the same numbers. `queued_probe=False`: as on a link
    too fast for the queued probe's pieces. `one_core=True`: every rank told it may run on core 0
    only, as ranks sharing one core are."""
    if not queued_probe:
        import caramel.topology.probe as probe

        probe.queued_piece_bytes = lambda *args: None
    if one_core:
        import os

        os.sched_getaffinity = lambda pid: {0}
    w = fresh("cnn_bn")
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, overlap="backward", profile_steps=1)
    train(model, opt, sched, w.loss_fn, "cnn_bn", rank, steps)
    opt.synchronize()
    controller = opt.engine.controller
    return {"latency_s": opt.engine.stats.extra.get("measured_latency_s"),
            "queued_latency_s": opt.engine.stats.extra.get("measured_queued_latency_s"),
            "queued_extra_s": opt.engine.stats.extra.get("measured_queued_extra_s"),
            "collective_cpu_s": opt.engine.stats.extra.get("measured_collective_cpu_s"),
            "core_share": opt.engine.stats.extra.get("measured_core_share"),
            "cores": len(__import__("os").sched_getaffinity(0)),
            "plan_collective_cpu_s": controller.plan_cluster.collective_cpu_s if controller.plan_cluster else None,
            "plan_latency_s": controller.plan_cluster.latency_s if controller.plan_cluster else None,
            "plan_queued_latency_s": controller.plan_cluster.queued_latency_s if controller.plan_cluster else None,
            "plan_bandwidth_bps": controller.plan_cluster.bandwidth_bps if controller.plan_cluster else None,
            "profiling": controller.profiling}


def slow_peer_profile_worker(rank: int, world: int, delay_s: float, broadcast_buffers) -> dict:
    """Online profiling while rank 1 starts every step `delay_s` late: rank 0 waits for it in
    the buffer broadcast at the forward's start, or (rank-local buffers) for its collectives in
    step(); either wait is communication, not forward or optimizer time."""
    import time

    w = fresh("cnn_bn")
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, overlap="backward", profile_steps=2,
                                     broadcast_buffers=broadcast_buffers)
    controller = opt.engine.controller
    forward_s, waits = [], []
    for step in range(4):
        if rank == 1:
            time.sleep(delay_s)
        x, y = batch("cnn_bn", step, rank)
        t0 = time.perf_counter()
        out = model(x)
        forward_s.append(time.perf_counter() - t0)
        w.loss_fn(out, y).backward()
        opt.step()
        waits.append(opt.engine.stats.last_wait_s)
        opt.zero_grad()
    opt.synchronize()
    p = controller.profile
    return {"profiling": controller.profiling, "forward_time_s": p.forward_time_s,
            "optimizer_time_s": p.optimizer_time_s, "forward_s": forward_s, "waits_s": waits}


def delegation_worker(rank: int, world: int, family: str, steps: int) -> dict:
    """DDP's schedule kept: torch DDP takes the gradients over mid-training (step 6), a re-profile
    takes them back (step 12); with gradient accumulation and clipping on both sides of each
    switch, parameters equal DDP's."""
    w = fresh(family)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=(family == "mlp_unused"))
    ropt, rsched = make_optimizer("adam", ddp.parameters())
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("adam", m.parameters())
    model, opt = caramel.parallelize(m, opt, planner="fifo", overlap="backward")
    controller = opt.engine.controller
    out = {"delegating": {}}

    def one(mdl, o, s, clip, step):
        if step % 4 == 1:  # accumulate a second micro-batch locally first
            with mdl.no_sync():
                x, y = batch(family, 100 + step, rank)
                w.loss_fn(mdl(x), y).backward()
        x, y = batch(family, step, rank)
        w.loss_fn(mdl(x), y).backward()
        if step % 4 == 2:
            clip(o)
        o.step()
        s.step()
        o.zero_grad()

    for step in range(steps):
        if step == 6:
            controller.handover.hand_over()
        if step == 12:
            controller.start_profiling()
        one(ddp, ropt, rsched, lambda o: torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.05), step)
        one(model, opt, sched, lambda o: caramel.clip_grad_norm_(o, 0.05), step)
        out["delegating"][step] = opt.engine.delegating
        if step == 6:
            out["ddp_on_job_group"] = opt.engine.ddp.process_group is dist.group.WORLD
            out["comm_priority"] = opt.engine.stats_dict()["comm_priority"]
    opt.synchronize()
    out["diff"] = max_diff(params_of(ddp.module), params_of(model.module))
    out["stats"] = opt.engine.stats_dict()["delegated_to_ddp"]
    # handed over again, then shut down: a further step is an error, not torch DDP quietly going on
    controller.handover.hand_over()
    caramel.shutdown()
    try:
        one(model, opt, sched, lambda o: None, steps)
        out["after_shutdown"] = None
    except caramel.CaramelError as e:
        out["after_shutdown"] = str(e)
    return out


def vouched_delegation_worker(rank: int, world: int, family: str, steps: int) -> dict:
    """parallelize(find_unused_parameters=False): the hand-over builds torch DDP without its search
    for unused parameters; exact against plain DDP when every parameter gets a gradient, and a
    caramel error naming the option when one does not."""
    w = fresh(family)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=(family == "mlp_unused"))
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("sgd_momentum", m.parameters())
    model, opt = caramel.parallelize(m, opt, planner="fifo", overlap="backward", find_unused_parameters=False)
    out = {"error": None}
    for step in range(steps):
        if step == 6:
            opt.engine.controller.handover.hand_over()
            out["search"] = opt.engine.ddp.find_unused_parameters
        x, y = batch(family, step, rank)
        try:
            for mdl, o, s in ((model, opt, sched), (ddp, ropt, rsched)):
                w.loss_fn(mdl(x), y).backward()
                o.step()
                s.step()
                o.zero_grad()
        except RuntimeError as e:
            out["error"] = str(e)
            out["error_step"] = step
            break
    if out["error"] is None:
        opt.synchronize()
        out["diff"] = max_diff(params_of(ddp.module), params_of(model.module))
    caramel.shutdown()
    return out


def issue_order_worker(rank: int, world: int, overlap: str, trace_dir: str) -> dict:
    """Per step after planning: did any collective start before the last bucket was ready (seen in
    the trace)? Steps 0-3 profile on a provisional one-bucket plan."""
    import json
    from pathlib import Path

    w = fresh("cnn_bn")
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, planner="fifo", overlap=overlap, bucket_cap_mb=0.002, first_bucket_mb=0.002,
                                     trace=str(Path(trace_dir) / f"{overlap}.json"))
    train(model, opt, sched, w.loss_fn, "cnn_bn", rank, 10)
    opt.synchronize()  # writes the trace
    events = json.loads(Path(opt.engine.trace_path).read_text())["events"]
    early = {}
    for it in {e["iteration"] for e in events if e["iteration"] >= 5}:
        ready = [e["start_s"] for e in events if e["iteration"] == it and e["kind"] == "ready"]
        issue = [e["start_s"] for e in events if e["iteration"] == it and e["kind"] == "issue"]
        if ready and issue:
            early[it] = min(issue) < max(ready)
    return {"early": early, "buckets": len(opt.engine.buckets)}


def plan_inputs_worker(rank: int, world: int, trace_dir: str) -> dict:
    """Traced, with online profiling: rank 0 leaves the profile and cluster it planned from beside
    its trace, and the same planner makes the same plan from them offline."""
    import json
    from pathlib import Path

    from caramel.topology.spec import ClusterSpec
    from caramel.strategies.planners import make_plan
    from caramel.profile.model_profile import ModelProfile

    w = fresh("cnn_bn")
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, planner="caramel", overlap="backward",
                                     trace=str(Path(trace_dir) / "run.json"))
    train(model, opt, sched, w.loss_fn, "cnn_bn", rank, 8)
    opt.synchronize()  # writes the trace (and, on rank 0, the plan's inputs)
    trace = Path(opt.engine.trace_path)
    meta = json.loads(trace.read_text())["meta"]
    out = {"meta": {k: v for k, v in meta.items() if k.startswith("planned_from")}, "ran": opt.engine.plan.fingerprint}
    if rank == 0:
        profile = ModelProfile.load(trace.parent / meta["planned_from_profile"])
        cluster = ClusterSpec.load(trace.parent / meta["planned_from_cluster"])
        out["replayed"] = make_plan("caramel", profile, cluster, world_size=world, overlap="backward").fingerprint
        out["measured_link"] = cluster.meta.get("measured")
    caramel.shutdown()
    return out


def reprofile_mid_trial_worker(rank: int, world: int, steps: int) -> dict:
    """overlap="auto": a re-profile starts in the middle of the trial (as a changed module order
    seen by a periodic check would start it); the trial in progress ends there, the profiling
    steps run on the provisional plan, and a new trial follows. Parameters equal DDP's."""
    w = fresh("cnn_bn")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt, rsched = make_optimizer("adam", ddp.parameters())
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("adam", m.parameters())
    model, opt = caramel.parallelize(m, opt, overlap="auto", trial_steps=2, trial_passes=1)
    controller = opt.engine.controller
    out = {"trial_at_7": None, "trial_after": None}
    for step in range(steps):
        if step == 7:
            out["trial_at_7"] = controller.trial is not None
            controller.start_profiling()
            out["trial_after"] = controller.trial is not None
            out["plan_while_profiling"] = opt.engine.plan.planner
        for mdl, o, s in ((ddp, ropt, rsched), (model, opt, sched)):
            x, y = batch("cnn_bn", step, rank)
            w.loss_fn(mdl(x), y).backward()
            o.step()
            s.step()
            o.zero_grad()
        if step == 8:
            out["plan_step_8"] = opt.engine.plan.planner
    opt.synchronize()
    out["diff"] = max_diff(params_of(ddp.module), params_of(model.module))
    out["final_trial"] = opt.engine.stats.extra.get("overlap_trial")
    out["settled"] = caramel.runtime.schedule_settled(opt)
    caramel.shutdown()
    return out


def buffer_change_worker(rank: int, world: int, broadcast_buffers, who_resets: str, steps: int,
                         strategy: str = "caramel", change: str = "reset", change_at: int | None = None) -> dict:
    """BatchNorm statistics changed after step `change_at` (default steps // 2), on every rank or on
    rank 0 only, and an eval forward after a training step: buffers and parameters against DDP,
    which broadcasts rank 0's buffers as each forward starts. `change`: "reset"
    (reset_running_stats), "load" (a load_state_dict of the first step's buffers) or
    "forwards" (3 no-grad train-mode forwards, as precise-BN recomputation)."""
    change_at = steps // 2 if change_at is None else change_at
    saved: dict = {}

    def reset(model: nn.Module) -> None:
        if who_resets == "all" or rank == 0:
            if change == "load":  # the buffers only: parameters loaded with pulls in flight are another matter
                model.load_state_dict(saved["buffers"], strict=False)
                return
            with torch.no_grad():
                for k in range(3 if change == "forwards" else 0):
                    model(batch("cnn_bn", 50 + k, rank)[0])
            for m in model.modules():
                if change == "reset" and isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.reset_running_stats()

    def run(model, opt, sched, w) -> list[torch.Tensor]:
        evals = []
        for step in range(steps):
            x, y = batch("cnn_bn", step, rank)
            w.loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            if step == 0:
                buffers = {n for n, _ in model.module.named_buffers()}
                saved["buffers"] = {k: v.clone() for k, v in model.module.state_dict().items() if k in buffers}
            if step == change_at:
                reset(model.module)
            if step % 3 == 1:  # eval forwards read the statistics rank 0 sent
                model.eval()
                with torch.no_grad():
                    evals.append(model(x).detach().clone())
                model.train()
        return evals

    w = fresh("cnn_bn")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    ref_evals = run(ddp, ropt, rsched, w)
    opt, sched = make_optimizer("sgd_momentum", w.model.parameters())
    kw = {"overlap": "forward"} if strategy == "caramel" else {}
    model, opt = caramel.parallelize(w.model, opt, strategy, broadcast_buffers=broadcast_buffers, timeout_s=20, **kw)
    try:
        evals = run(model, opt, sched, w)
        opt.synchronize()
    except caramel.CaramelError as e:
        return {"error": str(e)}
    except RuntimeError as e:  # the peer that raised is gone
        return {"error": f"peer: {e}"}
    return {"error": None, "diff": max_diff(params_of(ddp.module), params_of(model.module)),
            "eval_diff": max_diff(ref_evals, evals),
            "buffers_equal": all(torch.equal(a, b) for a, b in zip(ddp.module.buffers(), model.module.buffers()))}


def compute_schedule_worker(rank: int, world: int, steps: int, schedules: tuple, overlaps: tuple,
                            dtype: torch.dtype = torch.float32) -> dict:
    """Deferred weight gradients forced on (k layers, or "all" the model has), every family and
    optimizer, with no_sync accumulation and clipping in some steps, against DDP, in `dtype`."""
    out = {}
    for family in FAMILIES:
        for opt_kind in OPTIMIZERS:
            w = fresh(family)
            w.model.to(dtype)
            w.inputs = _as(w.inputs, dtype)
            ref_model = copy.deepcopy(w.model)
            ddp = torch.nn.parallel.DistributedDataParallel(ref_model, find_unused_parameters=(family == "mlp_unused"))
            ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
            _train_messy(ddp, ropt, rsched, w.loss_fn, family, rank, steps, clip=torch.nn.utils.clip_grad_norm_,
                         dtype=dtype)
            ref = params_of(ddp.module)
            for k in schedules:
                for overlap in overlaps:
                    m = copy.deepcopy(w.model)
                    opt, sched = make_optimizer(opt_kind, m.parameters())
                    kk = _all_deferrable(m, w) if k == "all" else k
                    model, opt = caramel.parallelize(m, opt, overlap=overlap, compute_schedule=kk)
                    _train_messy(model, opt, sched, w.loss_fn, family, rank, steps,
                                 clip=lambda ps, n, o=opt: caramel.clip_grad_norm_(o, n), dtype=dtype)
                    opt.synchronize()
                    out[(family, opt_kind, k, overlap)] = max_diff(ref, params_of(model.module))
                    schedule = opt.engine.plan.compute_schedule
                    out[(family, opt_kind, k, overlap, "deferred")] = list(schedule.modules) if schedule else []
                    out[(family, opt_kind, k, overlap, "profile")] = _profile_sanity(opt.engine.controller.profile)
    return out


def _profile_sanity(prof) -> list[str]:
    """What is wrong with an online profile measured with split steps (empty: nothing): its
    forward and backward timed, every gradient ready within the backward it was timed in."""
    bad = []
    if not prof.forward_time_s > 0 or not prof.backward_time_s > 0:
        bad.append(f"forward {prof.forward_time_s} s, backward {prof.backward_time_s} s")
    bad += [f"{p.name} ready at {p.ready_time_s} s" for p in prof.params
            if p.ready_time_s is not None and not 0 <= p.ready_time_s <= prof.backward_time_s * 1.5]
    return bad


def _all_deferrable(model: nn.Module, w) -> int:
    """How many layers of `model` a plan may defer (what `compute_schedule="all"` stands for here)."""
    from caramel.profile.profiler import profile_model
    prof = profile_model(copy.deepcopy(model), w.inputs, w.targets, w.loss_fn, steps=1)
    return sum(1 for m in prof.modules if m.splittable)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() else x


def _train_messy(model, opt, sched, loss_fn, family, rank, steps, clip, dtype=torch.float32):
    """Like `train`, with two micro-batches accumulated under no_sync every third step and the
    global norm clipped every fourth."""
    for step in range(steps):
        x, y = batch(family, step, rank)
        x = _as(x, dtype)
        if step % 3 == 2:
            with model.no_sync():
                x2, y2 = batch(family, step + 100, rank)
                x2 = _as(x2, dtype)
                loss_fn(model(x2), y2).backward()
        loss_fn(model(x), y).backward()
        if step % 4 == 3:
            clip(model.parameters(), 0.5)
        opt.step()
        sched.step()
        opt.zero_grad()
