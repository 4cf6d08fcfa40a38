"""Worker functions for the compression and balance tests (spawned; must be importable)."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

import caramel
import caramel.strategies.caramel.ddp_shares as ddp_shares
from caramel.plan.planners import group_by_cap, plan_from_groups, ready_sorted
from caramel.profile.profiler import profile_model
from tests.distributed.workers import batch, fresh, make_optimizer, max_diff, params_of
from tests.strategies.adapt.virtual_clock import VirtualClock

FAMILY = "mlp_unused"  # several buckets, and a parameter no rank uses in some steps


def _plan(w, world: int):
    """Small buckets, the largest in 2 chunks: the codecs see several buckets and chunks."""
    prof = profile_model(copy.deepcopy(w.model), w.inputs, w.targets, w.loss_fn, steps=1)
    groups = group_by_cap(ready_sorted(prof), [2048])
    chunks = [2 if sum(prof.params[p.index].numel for p in g) > 64 else 1 for g in groups]
    return plan_from_groups("handmade", prof, world, groups, chunks=chunks)


def _run(w, plan, compression: str, rank: int, steps: int, start: int = 0, state=None):
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("sgd_momentum", m.parameters())
    model, opt = caramel.parallelize(m, opt, plan=plan, overlap="forward", compression=compression)
    if state is not None:
        model.module.load_state_dict(state[0])
        opt.load_state_dict(state[1])
    for step in range(start, start + steps):
        x, y = batch(FAMILY, step, rank)
        loss = w.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    return model, opt


def compression_worker(rank: int, world: int, steps: int, online_steps: int = 14) -> dict:
    torch.set_num_threads(1)
    w = fresh(FAMILY)
    plan = _plan(w, world)
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=True)
    ropt, rsched = make_optimizer("sgd_momentum", ddp.parameters())
    for step in range(steps):
        x, y = batch(FAMILY, step, rank)
        w.loss_fn(ddp(x), y).backward()
        ropt.step()
        ropt.zero_grad()
    del rsched
    ref = params_of(ddp.module)
    out = {"buckets": len(plan.buckets), "items": len(plan.order)}
    for codec in ("fp16", "bf16", "topk:0.3", "powersgd:2"):
        model, opt = _run(w, plan, codec, rank, steps)
        mine = params_of(model.module)
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
        out[(codec, "vs_ddp")] = max_diff(ref, mine)
        out[(codec, "across_ranks")] = max(max_diff(gathered[0], g) for g in gathered)
        out[(codec, "state_keys")] = sorted(opt.state_dict().get("caramel_compression", {}))
    # online profiling, planning and the overlap trial with a codec: fp16 everywhere, or auto
    # (loopback is fast: whatever it picks, the result stays within fp16's rounding of DDP)
    for codec in ("fp16", "auto"):
        m = copy.deepcopy(w.model)
        opt, _ = make_optimizer("sgd_momentum", m.parameters())
        model, opt = caramel.parallelize(m, opt, compression=codec, trial_steps=2, trial_passes=1)
        ddp2 = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model), find_unused_parameters=True)
        ropt2, _ = make_optimizer("sgd_momentum", ddp2.parameters())
        for step in range(online_steps):
            x, y = batch(FAMILY, step, rank)
            for mod, o in ((model, opt), (ddp2, ropt2)):
                w.loss_fn(mod(x), y).backward()
                o.step()
                o.zero_grad()
        opt.synchronize()
        engine = opt.engine
        out[(codec, "online_vs_ddp")] = max_diff(params_of(ddp2.module), params_of(model.module))
        out[(codec, "online_codecs")] = engine.plan.compression
        out[(codec, "online_trial")] = sorted((engine.stats.extra.get("overlap_trial") or {}).get("step_period_s", {}))
    # a checkpoint resumes exactly: error feedback travels in the optimizer's state_dict
    half = steps // 2
    model, opt = _run(w, plan, "topk:0.3", rank, half)
    state = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(opt.state_dict()))
    whole = params_of(_run(w, plan, "topk:0.3", rank, steps)[0].module)
    resumed = params_of(_run(w, plan, "topk:0.3", rank, steps - half, start=half, state=state)[0].module)
    out["resume"] = max_diff(whole, resumed)
    # and without the state, it would not (the test can fail)
    cold = params_of(_run(w, plan, "topk:0.3", rank, steps - half, start=half,
                          state=(state[0], {k: v for k, v in state[1].items() if k != "caramel_compression"}))[0].module)
    out["resume_without_state"] = max_diff(whole, cold)
    return out



def _toy(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(96, 8, generator=g), torch.randn(96, 4, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model, x, y


class _ReduceBehind:
    """`torch.distributed` for `ddp_shares` on the `VirtualClock`: rank 0's all-reduce of a step's
    bucket (one: the toy model's gradient) holds it by `lead_s()`, the slow rank's longer forward,
    as it does on a real clock, where the hook times that hold as the step's wait."""

    def __init__(self, clock: VirtualClock, lead_s) -> None:
        self.clock, self.lead_s = clock, lead_s

    def all_reduce(self, *args, **kwargs):
        if self.clock.t is not None:
            self.clock.t += self.lead_s()
        return dist.all_reduce(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(dist, name)


class _HeldWork:
    """A gradient all-reduce's work on the `VirtualClock`: waiting on it holds the rank by
    `hold_s` (taken as it was issued: its step's lead of the peer), inside the engine's timed wait."""

    def __init__(self, work, clock: VirtualClock, hold_s: float) -> None:
        self.work, self.clock, self.hold_s = work, clock, hold_s

    def wait(self, *args, **kwargs):
        if self.hold_s:  # none before the clock starts (profiling runs on the wall clock)
            self.clock.t += self.hold_s
            self.hold_s = 0.0  # once per work
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.work, name)


class _CommBehind:
    """The engine's gradient group on the `VirtualClock` (Caramel's own schedule): a step's
    all-reduces hold the rank by `lead_s()` when waited on, as `_ReduceBehind` does under DDP.
    The hold goes with the step's first all-reduce only: the plan (searched on the wall clock)
    may split the gradient into several, and the peer's lead is one per step."""

    def __init__(self, comm, clock: VirtualClock, lead_s, step_of) -> None:
        self.comm, self.clock, self.lead_s, self.step_of = comm, clock, lead_s, step_of
        self.held_step = None

    def allreduce(self, *args, **kwargs):
        step = self.step_of()
        hold_s = self.lead_s() if step != self.held_step else 0.0
        if hold_s:
            self.held_step = step
        return _HeldWork(self.comm.allreduce(*args, **kwargs), self.clock, hold_s)

    def __getattr__(self, name: str):
        return getattr(self.comm, name)


class _Slow(torch.nn.Module):
    """The toy model, `delay_s` slower per sample on `clock` (an emulated slow worker)."""

    def __init__(self, inner: torch.nn.Module, delay_s: float, clock: VirtualClock):
        super().__init__()
        self.inner, self.delay_s, self.clock = inner, delay_s, clock

    def forward(self, x):
        self.clock.sleep(self.delay_s * x.shape[0])
        return self.inner(x)


def _on_the_clock_from_adoption(opt, clock: VirtualClock) -> None:
    """Profiling and planning run on the wall clock (real sleeps); the clock takes over as the
    plan is adopted (that step untimed), so every step the balancer times is on it."""
    c = opt.engine.controller
    adopt = c.adopt

    def adopting(*args, **kwargs):
        out = adopt(*args, **kwargs)
        clock.start(opt.engine)
        return out
    c.adopt = adopting


# per-sample forward slow-downs, rank 0's and rank 1's: rank 0's stands for its compute (on the
# virtual clock nothing else takes time), rank 1 is the slow worker
_SLOW_S_PER_SAMPLE = (0.001, 0.002)
_DDP_SLOW_S_PER_SAMPLE = (0.001, 0.004)


class _Gated(torch.nn.Module):
    """The toy model plus a layer only the samples with x[0] > 1.0 use: a rank whose batch holds
    none leaves that layer unused in its step (torch DDP finds it unused there)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner, self.extra = inner, torch.nn.Linear(8, 4)
        self.used: list[bool] = []

    def forward(self, x):
        y = self.inner(x)
        rows = (x[:, 0] > 1.0).nonzero().squeeze(1)
        if torch.is_grad_enabled():
            self.used.append(bool(rows.numel()))
        return y.index_add(0, rows, self.extra(x[rows])) if rows.numel() else y


def balance_worker(rank: int, world: int, steps: int, global_batch: int) -> dict:
    """Unequal, changing shares against single-process training on the union batch; then a
    slowed rank 1 and the shares the balancer measures for it."""
    from caramel.strategies.caramel.balance import balanced_sampler
    torch.set_num_threads(1)
    out = {}
    # 1. forced shares: [2, 6], then [5, 3] from the first undrawn batch (4: batch 3 is drawn as i == 3)
    model, x, y = _toy()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = caramel.parallelize(model, opt, overlap="forward", balance="batch", balance_every=0)
    sampler = balanced_sampler(opt, len(x), global_batch, seed=3, counts=[2, 6][:world] if world == 2 else None)
    seen = []
    for i, idx in enumerate(sampler):
        if i == 3:
            sampler.schedule.change([5, 3], sampler.schedule.drawn)
        if i == steps:
            break
        seen.append(len(idx))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    _train_on_the_union(ref, x, y, global_batch, steps)
    out["union"] = max_diff(params_of(ref), params_of(model.module))
    out["sizes"] = seen
    # 2. rank 1 slowed 2 ms per sample, rank 0 1 ms, on a virtual clock: the balancer moves samples to rank 0;
    # the faster rank's gradient wait is held by the peer's lead, as on a real clock
    inner, x, y = _toy()
    clock = VirtualClock()  # time passes in `_Slow` and in `_HeldWork`'s holds once adopted
    slow = _Slow(inner, _SLOW_S_PER_SAMPLE[rank], clock)
    opt = torch.optim.SGD(slow.parameters(), lr=0.05)
    model, opt = caramel.parallelize(slow, opt, overlap="forward", balance="batch", balance_every=4)
    _on_the_clock_from_adoption(opt, clock)
    balancer = opt.engine.controller.balancer

    def lead_s() -> float:  # this rank's step ends this much before its peer's: it waits that long
        if clock.t is None:
            return 0.0
        n = balancer.local_batch
        return max((global_batch - n) * _SLOW_S_PER_SAMPLE[1 - rank] - n * _SLOW_S_PER_SAMPLE[rank], 0.0)

    dispatcher = opt.engine._dispatcher
    dispatcher.comm = _CommBehind(dispatcher.comm, clock, lead_s, lambda: opt.engine.stats.step)
    sampler = balanced_sampler(opt, len(x), global_batch, seed=5)
    drawn, sizes, waits = [], [], []
    for epoch in range(2):
        for idx in sampler:
            drawn.append(idx)
            on_the_clock = clock.t is not None
            torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
            opt.step()
            opt.zero_grad()
            # with overlap="forward" a step's gradient is waited for in the next step's forward
            sizes.append(len(idx) if on_the_clock else None)
            waits.append(opt.engine.stats.last_wait_s)
    opt.synchronize()
    out["equal_waits_s"] = [w for a, b, w in zip(sizes, sizes[1:], waits[1:]) if a == b == global_batch // 2]
    out["counts"] = sampler.schedule.current
    out["changes"] = len(opt.engine.controller.balancer.changes)
    out["windows"] = {n: list(q) for n, q in opt.engine.controller.balancer.times.items()}
    out["on_the_clock"] = clock.t is not None
    out["drawn"] = drawn
    out.update(_under_ddp(steps, global_batch))
    return out



def _train_on_the_union(ref, x, y, global_batch: int, steps: int) -> None:
    """The single-process reference: `steps` SGD steps on the whole global batch, in the order
    the balanced sampler (seed 3) draws it across the ranks."""
    from caramel.data.share_sampler import ShareSampler, ShareSchedule

    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _, idx in zip(range(steps), ShareSampler(len(x), ShareSchedule(global_batch, 1), 0, seed=3)):
        torch.nn.functional.mse_loss(ref(x[idx]), y[idx]).backward()
        ropt.step()
        ropt.zero_grad()

def _under_ddp(steps: int, global_batch: int) -> dict:
    """DDP's schedule with balance="batch" (torch DDP through `SharesHook`): forced unequal shares
    against the union batch, then rank 1 slowed 4 ms per sample (rank 0 1 ms, on the virtual
    clock) and what its peer waits."""
    from caramel.strategies.caramel.balance import balanced_sampler
    import functools
    out = {}
    # shares [2, 6], handed to torch DDP at batch 4 (after the plan the profiling steps make), [5, 3] from batch 7;
    # DDP's buckets capped at 200 bytes (several buckets), and a layer some ranks' batches leave unused
    inner, x, y = _toy()
    model = _Gated(inner)
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = caramel.parallelize(model, opt, overlap="forward", balance="batch", balance_every=0)
    sampler = balanced_sampler(opt, len(x), global_batch, seed=3, counts=[2, 6])
    total = steps + 4
    delegating = []
    ddp_class = torch.nn.parallel.DistributedDataParallel
    for i, idx in enumerate(sampler):
        if i == 4:
            torch.nn.parallel.DistributedDataParallel = functools.partial(ddp_class, bucket_cap_mb=0.0002)
            try:
                opt.engine.controller.handover.hand_over()
            finally:
                torch.nn.parallel.DistributedDataParallel = ddp_class
            out["ddp_buckets"] = len(opt.engine.ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
        if i == 6:
            sampler.schedule.change([5, 3], sampler.schedule.drawn)
        if i == total:
            break
        torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
        opt.step()
        opt.zero_grad()
        delegating.append(opt.engine.delegating)
    opt.synchronize()
    _train_on_the_union(ref, x, y, global_batch, total)
    out["ddp_union"] = max_diff(params_of(ref), params_of(model.module))
    out["ddp_delegating"] = delegating
    out["ddp_extra_used"] = model.module.used[4:total]  # the steps under torch DDP
    # rank 1 sleeps 4 ms per sample of its 4 (rank 0 1 ms), on a virtual clock: under torch DDP
    # rank 0's all-reduce is held by rank 1's lead, the hook times that wait, and the balancer
    # (deciding every 8 steps, from step 8: after the hand-over at step 5) moves samples to rank 0
    rank = torch.distributed.get_rank()
    inner, x, y = _toy()
    clock = VirtualClock()  # time passes in `_Slow` and in `_ReduceBehind`'s holds once started
    slow = _Slow(inner, _DDP_SLOW_S_PER_SAMPLE[rank], clock)
    opt = torch.optim.SGD(slow.parameters(), lr=0.05)
    model, opt = caramel.parallelize(slow, opt, overlap="forward", balance="batch", balance_every=8)
    _on_the_clock_from_adoption(opt, clock)
    balancer = opt.engine.controller.balancer

    def lead_s() -> float:  # rank 0 reaches the step's all-reduce this much before rank 1
        n0 = balancer.local_batch
        slow_s, fast_s = (global_batch - n0) * _DDP_SLOW_S_PER_SAMPLE[1], n0 * _DDP_SLOW_S_PER_SAMPLE[0]
        return max(slow_s - fast_s, 0.0) if rank == 0 else 0.0

    ddp_shares.time, ddp_shares.dist = clock, _ReduceBehind(clock, lead_s)  # this spawned process's hook only
    sampler = balanced_sampler(opt, len(x), global_batch, seed=5)
    equal_waits = []  # rank 0's timed waits under torch DDP while the shares are still equal
    for epoch in range(2):
        for idx in sampler:
            if sampler.schedule.drawn == 5:
                opt.engine.controller.handover.hand_over()
            # hand_over() sets delegating at once, so the hand-over's own step counts too: its
            # wait is the hook's timed all-reduce only (the engine waits on nothing under DDP)
            clean = opt.engine.delegating
            torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
            opt.step()
            opt.zero_grad()
            if clean and len(idx) == global_batch // 2:
                equal_waits.append(opt.engine.stats.last_wait_s)
    opt.synchronize()
    out["ddp_equal_waits_s"] = equal_waits
    out["ddp_counts"] = sampler.schedule.current
    out["ddp_change_steps"] = [c["step"] for c in opt.engine.controller.balancer.changes]
    out["ddp_windows"] = {n: list(q) for n, q in balancer.times.items()}
    out["ddp_buckets_slowed"] = len(opt.engine.ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
    out["ddp_on_the_clock"] = clock.t is not None
    return out
