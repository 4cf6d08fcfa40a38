"""Worker functions for the real-models-are-messy tests: each case trains a model with Caramel
and with DDP side by side on the same data and returns the largest parameter difference."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import caramel
from caramel.models.zoo import BranchyMLP, SmallCNN

STEPS = 12


class TwiceUsed(nn.Module):
    """One Linear applied twice in a forward, plus a head."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.shared = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = F.relu(self.shared(h))
        h = F.relu(self.shared(h))
        return self.head(h)


class Reorders(nn.Module):
    """Two blocks whose order flips when `swap` is set: the forward's module order changes."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)
        self.swap = False

    def forward(self, x):
        h = F.relu(self.inp(x))
        first, second = (self.b, self.a) if self.swap else (self.a, self.b)
        h = F.relu(second(F.relu(first(h))))
        return self.head(h)


def _data(step: int, rank: int, d_in: int = 16, classes: int = 4, n: int = 6):
    g = torch.Generator().manual_seed(7919 * step + 101 * rank)
    return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def _diff(a: nn.Module, b: nn.Module) -> float:
    pa = list(a.parameters()) + [t for t in a.buffers() if t.is_floating_point()]
    pb = list(b.parameters()) + [t for t in b.buffers() if t.is_floating_point()]
    return max(float((x - y).detach().abs().max()) for x, y in zip(pa, pb))


def _pair(model: nn.Module, opt_fn, find_unused=False, **kw):
    ref = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(ref, find_unused_parameters=find_unused)
    ropt = opt_fn([p for p in ddp.parameters() if p.requires_grad])
    opt = opt_fn([p for p in model.parameters() if p.requires_grad])
    cm, copt = caramel.parallelize(model, opt, planner=kw.pop("planner", "fifo"), **kw)
    return cm, copt, ddp, ropt


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def _train_frozen_conv1(rank, opt_fn, **kw):
    """SmallCNN with conv1's weight frozen, trained with Caramel and DDP side by side."""
    torch.manual_seed(0)
    m = SmallCNN()
    m.conv1.weight.requires_grad_(False)
    cm, copt, ddp, ropt = _pair(m, opt_fn, **kw)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step * 13 + rank)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        for mod, o in ((cm, copt), (ddp, ropt)):
            F.cross_entropy(mod(x), y).backward()
            o.step()
            o.zero_grad()
    copt.synchronize()
    return cm, copt, ddp


def case_frozen(rank, world):
    cm, _, ddp = _train_frozen_conv1(rank, _adamw)
    return _diff(cm.module, ddp.module)


def case_frozen_with_deferred_weight_gradients(rank, world):
    """A frozen first layer is not split; the two layers after it defer their weight gradients."""
    cm, copt, ddp = _train_frozen_conv1(rank, _sgd, compute_schedule=2)
    schedule = copt.engine.plan.compute_schedule
    if schedule is None or len(schedule.modules) != 2 or "conv1" in schedule.modules:
        return f"expected two deferred layers after the frozen conv1, got {schedule and schedule.modules}"
    return _diff(cm.module, ddp.module)


def case_unused_some_steps(rank, world):
    torch.manual_seed(0)
    cm, copt, ddp, ropt = _pair(BranchyMLP(d_in=16, classes=4), _adamw, find_unused=True)
    for step in range(STEPS):
        x, y = _data(step, rank)
        use_branch = (step + rank) % 3 == 0  # data-dependent: ranks differ at some steps
        for mod, o in ((cm, copt), (ddp, ropt)):
            F.cross_entropy(mod(x, use_branch=use_branch), y).backward()
            o.step()
            o.zero_grad()
    copt.synchronize()
    return _diff(cm.module, ddp.module)


def case_used_twice(rank, world):
    torch.manual_seed(0)
    cm, copt, ddp, ropt = _pair(TwiceUsed(), _sgd)
    for step in range(STEPS):
        x, y = _data(step, rank)
        for mod, o in ((cm, copt), (ddp, ropt)):
            F.cross_entropy(mod(x), y).backward()
            o.step()
            o.zero_grad()
    copt.synchronize()
    return _diff(cm.module, ddp.module)


def case_no_sync_accumulation(rank, world, k=3):
    torch.manual_seed(0)
    cm, copt, ddp, ropt = _pair(TwiceUsed(), _adamw)
    for step in range(STEPS):
        for mod, o in ((cm, copt), (ddp, ropt)):
            for micro in range(k):
                x, y = _data(step * k + micro, rank)
                if micro < k - 1:
                    with mod.no_sync():
                        (F.cross_entropy(mod(x), y) / k).backward()
                else:
                    (F.cross_entropy(mod(x), y) / k).backward()
            o.step()
            o.zero_grad()
    copt.synchronize()
    return _diff(cm.module, ddp.module)


def case_clip(rank, world):
    torch.manual_seed(0)
    cm, copt, ddp, ropt = _pair(TwiceUsed(), _sgd)
    norms = []
    for step in range(STEPS):
        x, y = _data(step, rank)
        F.cross_entropy(cm(x), y).backward()
        n1 = caramel.clip_grad_norm_(copt, 0.5)
        copt.step()
        copt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        n2 = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
        ropt.step()
        ropt.zero_grad()
        norms.append(abs(float(n1) - float(n2)))
    copt.synchronize()
    return max(_diff(cm.module, ddp.module), max(norms))


def case_eval_and_state_dict(rank, world):
    """Without an explicit synchronize: state_dict() and eval() see every update."""
    torch.manual_seed(0)
    cm, copt, ddp, ropt = _pair(SmallCNN(), _sgd)
    diffs = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step * 13 + rank)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        for mod, o in ((cm, copt), (ddp, ropt)):
            F.cross_entropy(mod(x), y).backward()
            o.step()
            o.zero_grad()
        if step % 4 == 3:
            sd, rsd = cm.state_dict(), ddp.state_dict()
            assert list(sd) == list(rsd), "state_dict keys must match DDP's (module. prefix)"
            diffs.append(max(float((sd[k].float() - rsd[k].float()).abs().max()) for k in sd))
            cm.eval()
            ddp.eval()
            with torch.no_grad():
                diffs.append(float((cm(x) - ddp(x)).abs().max()))
            cm.train()
            ddp.train()
    return max(diffs)


def case_order_change(rank, world):
    torch.manual_seed(0)
    cm, copt, ddp, ropt = _pair(Reorders(), _adamw, check_every=2)
    for step in range(STEPS + 8):
        swap = step >= 8
        cm.module.swap = swap
        ddp.module.swap = swap
        x, y = _data(step, rank)
        for mod, o in ((cm, copt), (ddp, ropt)):
            F.cross_entropy(mod(x), y).backward()
            o.step()
            o.zero_grad()
    copt.synchronize()
    changes = copt.engine.stats.extra.get("order_changes", 0)
    assert changes >= 1, "the changed module order was not detected"
    return _diff(cm.module, ddp.module)


def case_lbfgs_closure(rank, world):
    torch.manual_seed(0)
    m = TwiceUsed()
    ref = copy.deepcopy(m)
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    ropt = torch.optim.LBFGS(ddp.parameters(), lr=0.5, max_iter=4)
    cm, copt = caramel.parallelize(m, torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=4), planner="fifo")
    for step in range(4):
        x, y = _data(step, rank)
        for mod, o in ((cm, copt), (ddp, ropt)):
            def closure(mod=mod, o=o):
                o.zero_grad()
                loss = F.cross_entropy(mod(x), y)
                loss.backward()
                return loss
            o.step(closure)
    copt.synchronize()
    return _diff(cm.module, ddp.module)


def case_checkpoint_resume(rank, world):
    """optimizer/model state_dict() taken between lazy steps, loaded into a fresh parallelized
    pair, continues exactly like an uninterrupted DDP run (LR schedule included)."""
    torch.manual_seed(0)
    init = TwiceUsed()
    ref = copy.deepcopy(init)
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    ropt = _adamw(ddp.parameters())
    rsched = torch.optim.lr_scheduler.StepLR(ropt, 2, 0.7)

    def fresh_pair(m):
        opt = _adamw(m.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.7)
        cm, copt = caramel.parallelize(m, opt, planner="fifo", bucket_cap_mb=0.001, first_bucket_mb=0.001)
        return cm, copt, sched

    cm, copt, sched = fresh_pair(copy.deepcopy(init))
    for step in range(STEPS):
        if step == STEPS // 2:  # checkpoint, throw the pair away, resume into a new one
            state = {"model": cm.state_dict(), "opt": copt.state_dict(), "sched": sched.state_dict()}
            torch.manual_seed(123)
            cm, copt, sched = fresh_pair(TwiceUsed())
            cm.load_state_dict(state["model"])
            copt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
        x, y = _data(step, rank)
        for mod, o, s in ((cm, copt, sched), (ddp, ropt, rsched)):
            F.cross_entropy(mod(x), y).backward()
            o.step()
            s.step()
            o.zero_grad()
    copt.synchronize()
    return _diff(cm.module, ddp.module)


def case_tied_embedding_rows(rank, world):
    """The tied embedding's rows travel apart (`caramel.runtime.tied`) while the ranks look up
    different numbers of tokens (the exchange's capacity grows), gradients accumulate under
    no_sync, updates wait for the next forward, clipping reads the reduced gradients, and an
    evaluation forward runs between steps."""
    from caramel.models import get_model
    from caramel.models.zoo import _tokens

    w = get_model("tiny_gpt")(batch_size=2, seed=0)
    cm, copt, ddp, ropt = _pair(w.model, _adamw, planner="caramel", overlap="forward")
    assert len(copt.engine.row_exchanges) == 1
    for step in range(STEPS):
        batch = 1 + (step + rank) % 3  # ranks and steps look up different numbers of rows
        for mod, o, clip in ((cm, copt, caramel.clip_grad_norm_), (ddp, ropt, None)):
            for micro in range(2):
                x, y = _tokens(batch, 16, 64, seed=100 * step + 10 * rank + micro)
                if micro == 0:
                    with mod.no_sync():
                        (w.loss_fn(mod(x), y) / 2).backward()
                else:
                    (w.loss_fn(mod(x), y) / 2).backward()
            if clip is not None:
                clip(o, 1.0)
            else:
                torch.nn.utils.clip_grad_norm_(mod.parameters(), 1.0)
            o.step()
            o.zero_grad()
            if step % 4 == 3:
                with torch.no_grad():
                    mod.eval()
                    mod(x)
                    mod.train()
    copt.synchronize()
    assert copt.engine.row_exchanges[0].capacity >= 16, "the exchange never grew past one sequence"
    # the online profile saw the split: the weight's gradient first, its rows at the end
    tok = next(p for p in copt.engine.controller.profile.params if p.name == "tok.weight")
    assert tok.ready_order == 0 and tok.rows_ready_time_s > tok.ready_time_s, tok
    return _diff(cm.module, ddp.module)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def all_cases_worker(rank: int, world: int) -> dict:
    out = {}
    for name, fn in CASES.items():
        try:
            out[name] = fn(rank, world)
        except Exception as e:  # noqa: BLE001 - reported per case
            import traceback
            out[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    return out


def mismatch_cases_worker(rank: int, world: int, whats: list[str]) -> dict[str, str]:
    """`mismatch_worker` for each case in turn, in one process group: each case's error ends the
    same collectives on every rank, and the ranks check that they are at the same case before
    the next one starts."""
    out = {}
    for what in whats:
        out[what] = mismatch_worker(rank, world, what)
        seen: list = [None] * world
        dist.all_gather_object(seen, what)
        assert seen == [what] * world, f"rank {rank}: the ranks left the mismatch cases apart: {seen}"
    return out


def mismatch_worker(rank: int, world: int, what: str) -> str:
    """Ranks hold different models, or pass different options: every rank must get a clear error
    (returned as text)."""
    torch.manual_seed(0)
    width = 32 if (what == "shape" and rank == 1) else 16
    layers = [nn.Linear(8, width), nn.Linear(width, 4)]
    if what == "count" and rank == 1:
        layers.append(nn.Linear(4, 4))
    model = nn.Sequential(*layers)
    options = {"overlap": "backward"} if (what == "option" and rank == 1) else {}
    if what == "plan_file" and rank == 1:  # a file that node 0 has and node 1 lacks
        options = {"plan": "/nonexistent/caramel-plan.json"}
    if what == "cluster" and rank == 1:  # "rank 0 plans", but every rank measures or takes its cluster
        from caramel.topology.spec import ClusterSpec
        options = {"cluster": ClusterSpec.uniform(world, 1e9)}
    if what == "plan":  # rank 1's plan was made for 3 workers: rank 0, whose plan fits, must not wait on it
        from caramel.strategies.planners import make_plan
        profile = caramel.profile_model(copy.deepcopy(model), torch.randn(4, 8), torch.randn(4, 4), F.mse_loss, steps=1)
        options = {"plan": make_plan("fifo", profile, world_size=3 if rank == 1 else world)}
    try:
        caramel.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), **options)
    except caramel.MismatchError as e:
        return str(e)
    return "no error"


def replan_worker(rank: int, world: int, steps: int) -> dict:
    """replan="auto" on loopback: the first plan assumes a 10 Tbit/s link, which loopback is not,
    so the engine must re-plan for what it measures, at the same step with the same plan on
    every rank, and still train exactly like DDP."""
    from caramel.topology.spec import ClusterSpec
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
    cm, copt, ddp, ropt = _pair(m, _sgd, replan="auto", check_every=5,
                                cluster=ClusterSpec.uniform(world, bandwidth_bps=1e13))
    for step in range(steps):
        x, y = _data(step, rank)
        for mod, o in ((cm, copt), (ddp, ropt)):
            F.cross_entropy(mod(x), y).backward()
            o.step()
            o.zero_grad()
    copt.synchronize()
    return {"replans": copt.engine.stats.extra.get("bandwidth_replans", []), "diff": _diff(cm.module, ddp.module)}
