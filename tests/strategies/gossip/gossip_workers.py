"""Worker functions of the gossip strategy's multi-process tests (spawned; must be importable)."""
from __future__ import annotations

import copy

import torch

import caramel
from tests.distributed.workers import batch, fresh, make_optimizer, max_diff, params_of, train
from tests.strategies.gossip.moments_workers import debiased_update_worker, halves_vs_ddp_worker
from tests.strategies.gossip.overlap_workers import (batchnorm_worker, closure_worker, overlap_adam_update_worker,
                                                    overlap_update_worker)


def _gossip(family: str, opt_kind: str, steps: int, rank: int, spec: str):
    w = fresh(family)
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer(opt_kind, m.parameters())
    model, opt = caramel.parallelize(m, opt, spec)
    train(model, opt, sched, w.loss_fn, family, rank, steps)
    opt.synchronize()
    return model, opt


def reference(family: str, opt_kind: str, steps: int, world: int, spec: str, options=None) -> list[list[torch.Tensor]]:
    """Every worker of a gossip run, simulated in one process: each copy steps on its own batches,
    then the copies mix with the step's matrix (dpsgd, momentum: after the step, momentum buffers
    too for momentum; overlap, adam: the previous step's parameters, just before the update;
    overlap_momentum: those and the moment buffers)."""
    from caramel.strategies import STRATEGIES
    from caramel.strategies.gossip.topology import mixing_matrix

    options = options if options is not None else STRATEGIES.spec(spec).options
    w = fresh(family)
    models = [copy.deepcopy(w.model) for _ in range(world)]
    opts = [make_optimizer(opt_kind, m.parameters()) for m in models]
    cta = options.mixes_at_update

    def mix(step: int) -> None:
        W = mixing_matrix(options.topology, world, step)
        kinds = [[list(m.parameters()) for m in models]]  # per kind: every worker's list of tensors
        if options.mixes_moments:
            for key in ("momentum_buffer",) if opt_kind == "sgd_momentum" else ("exp_avg", "exp_avg_sq"):
                kinds.append([[o.state[p][key] for p in m.parameters()] for m, (o, _) in zip(models, opts)])
        with torch.no_grad():
            for per_worker in kinds:
                for tensors in zip(*per_worker):  # one tensor, on every worker
                    new = [sum(float(W[i, j]) * tensors[j] for j in range(world) if W[i, j] > 0) for i in range(world)]
                    for t, v in zip(tensors, new):
                        t.copy_(v)

    for step in range(steps):
        for r, m in enumerate(models):
            x, y = batch(family, step, r)
            w.loss_fn(m(x), y).backward()
        if cta and step > 0:
            mix(step - 1)  # the parameters the gradients were computed at, mixed before the update
        for o, sch in opts:
            o.step()
            sch.step()
            o.zero_grad()
        if not cta:
            mix(step)
    return [params_of(m) for m in models]


def parity_worker(rank: int, world: int, steps: int, cases: tuple[tuple[str, str, str], ...]) -> dict:
    """Each (family, optimizer, spec): the max abs difference of this worker's parameters from
    DDP's and from the one-process reference of every worker (`reference`), and how far they moved."""
    out = {}
    for family, opt_kind, spec in cases:
        w = fresh(family)
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
        ropt, rsched = make_optimizer(opt_kind, ddp.parameters())
        train(ddp, ropt, rsched, w.loss_fn, family, rank, steps)
        model, opt = _gossip(family, opt_kind, steps, rank, spec)
        mine = params_of(model.module)
        key = (family, opt_kind, spec)
        out[key + ("ddp",)] = max_diff(params_of(ddp.module), mine)
        out[key + ("reference",)] = max_diff(reference(family, opt_kind, steps, world, spec)[rank], mine)
        out[key + ("moved",)] = max_diff(params_of(w.model), mine)
        out[key + ("bytes",)] = opt.gossip.stats_dict()["bytes_per_peer_per_step"]
        out[key + ("params",)] = [t.numpy() for t in mine]
        caramel.shutdown()
    return out


def _average(tensors: list[torch.Tensor], world: int) -> list[torch.Tensor]:
    for t in tensors:
        torch.distributed.all_reduce(t)
        t /= world
    return tensors


def consensus_worker(rank: int, world: int, steps: int, specs: tuple[str, ...]) -> dict:
    """lr=0 from different parameters on every worker: only mixing moves them. Per spec, the
    measured consensus distance per step and every worker's final parameters."""
    out = {}
    for spec in specs:
        w = fresh("gpt_tied")
        opt = torch.optim.SGD(w.model.parameters(), lr=0.0)
        model, opt = caramel.parallelize(w.model, opt, spec, consensus_every=1)
        with torch.no_grad():  # after parallelize's broadcast: every worker elsewhere
            gen = torch.Generator().manual_seed(100 + rank)
            for p in w.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
        start_mean = _average(params_of(w.model), world)
        for step in range(steps):
            x, y = batch("gpt_tied", step, rank)
            w.loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        opt.synchronize()
        out[spec] = {"consensus": opt.gossip.stats_dict()["consensus"],
                     "mean_drift": max_diff(start_mean, _average(params_of(w.model), world)),
                     "params": [t.numpy() for t in params_of(w.model)]}
        caramel.shutdown()
    return out


def personal_worker(rank: int, world: int, steps: int) -> dict:
    """DePRL: the head (`lm_head` of the tiny transformer, here untied) stays local; every
    worker's batches differ, so heads diverge while the body mixes."""
    w = fresh("gpt_tied")
    opt = torch.optim.SGD(w.model.parameters(), lr=0.05, momentum=0.9)
    names = [n for n, _ in w.model.named_parameters()]
    model, opt = caramel.parallelize(w.model, opt, "gossip:topology=complete,algorithm=momentum",
                                     personalize=PERSONAL, consensus_every=1)
    sent = []
    real_start = opt.gossip.exchange.start

    def spy(nb):
        real_start(nb)
        sent.append({id(t) for b in opt.gossip.exchange.buckets for t in b.tensors})
    opt.gossip.exchange.start = spy
    for step in range(steps):
        x, y = batch("gpt_tied", step, rank)
        w.loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    local_ids = {id(p) for n, p in w.model.named_parameters() if n.startswith(PERSONAL)}
    avg = dict(opt.gossip.averaged_module().named_parameters())
    x, _ = batch("gpt_tied", 0, rank)
    out = {"average_is_own": all(torch.equal(avg[n], p) for n, p in w.model.named_parameters()),
           "average_runs": bool(torch.isfinite(opt.gossip.averaged_module()(x)).all()),"names": names, "stats": opt.gossip.stats_dict(),
           "params": {n: p.detach().numpy().copy() for n, p in w.model.named_parameters()},
           "local_sent": any(local_ids & s for s in sent)}
    caramel.shutdown()
    return out


PERSONAL = "blocks.1"


def checkpoint_worker(rank: int, world: int, steps: int, at: int, spec: str, opt_kind: str = "adamw") -> dict:
    """Train `steps` steps straight; then train `at` steps, save each worker's state, make a fresh
    model and optimizer, load it, and train the rest: the parameters must be equal, bit for bit."""
    def run(stop: int, state=None):
        w = fresh("gpt_tied")
        opt, sched = make_optimizer(opt_kind, w.model.parameters())
        model, opt = caramel.parallelize(w.model, opt, spec)
        first = 0
        if state is not None:
            opt.gossip.load_worker_state(state["worker"])
            sched.load_state_dict(state["sched"])
            first = state["step"]
        for step in range(first, stop):
            x, y = batch("gpt_tied", step, rank)
            w.loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        # A copy taken now, as a user's checkpoint would be: the optimizer state holds the live
        # moment tensors, which shutdown's flush would mix in place and so hide a lost pending mix.
        saved = copy.deepcopy({"worker": opt.gossip.worker_state(), "sched": sched.state_dict(), "step": stop})
        return params_of(w.model), saved

    straight, _ = run(steps)
    caramel.shutdown()
    _, saved = run(at)
    caramel.shutdown()
    resumed, _ = run(steps, saved)
    caramel.shutdown()
    return {"diff": max_diff(straight, resumed), "params": [t.numpy() for t in straight]}


def tensor_worker(rank: int, world: int, steps: int) -> dict:
    """`topology=` a tensor: trained against the one-process reference of that matrix, and the
    errors of a tensor of the wrong size and of one that is not doubly stochastic."""
    from caramel.errors import CaramelError
    from caramel.strategies import STRATEGIES

    W = torch.tensor([[0.75, 0.25], [0.25, 0.75]], dtype=torch.float32)
    w = fresh("gpt_tied")
    m = copy.deepcopy(w.model)
    opt, sched = make_optimizer("sgd_momentum", m.parameters())
    model, opt = caramel.parallelize(m, opt, "gossip", topology=W)
    train(model, opt, sched, w.loss_fn, "gpt_tied", rank, steps)
    opt.synchronize()
    ref = reference("gpt_tied", "sgd_momentum", steps, world, "gossip", STRATEGIES.spec("gossip", {"topology": W}).options)
    errors = {}
    for key, bad in (("size", torch.full((3, 3), 1 / 3)), ("stochastic", torch.tensor([[0.6, 0.4], [0.6, 0.4]]))):
        mb = copy.deepcopy(w.model)
        try:
            caramel.parallelize(mb, torch.optim.SGD(mb.parameters(), lr=0.1), "gossip", topology=bad)
            errors[key] = None
        except CaramelError as e:
            errors[key] = str(e)
    return {"reference": max_diff(params_of(model.module), ref[rank]),
            "params": [t.numpy() for t in params_of(m)], "topology": opt.gossip.stats_dict().get("topology"),
            "errors": errors}


def deprl_worker(rank: int, world: int, steps: int, tau: int) -> dict:
    """DePRL with tau head steps per body step: per step, how far the step's update moved the
    head and the body (measured around `opt.step()`, after the forward applied any pending mix)
    and the bytes it sent; the final parameters."""
    w = fresh("gpt_tied")
    opt = torch.optim.SGD(w.model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    model, opt = caramel.parallelize(w.model, opt, "gossip:topology=complete", personalize=PERSONAL, head_steps=tau)
    named = dict(w.model.named_parameters())
    head = [n for n in named if n.startswith(PERSONAL)]
    body = [n for n in named if not n.startswith(PERSONAL)]
    moved = []
    for step in range(steps):
        x, y = batch("gpt_tied", step, rank)
        w.loss_fn(model(x), y).backward()
        before = {n: p.detach().clone() for n, p in named.items()}
        grads_kept = all(named[n].grad is not None for n in named)
        opt.step()
        grads_kept = grads_kept and all(named[n].grad is not None for n in named)
        moved.append({part: max(float((named[n] - before[n]).abs().max()) for n in names)
                      for part, names in (("head", head), ("body", body))} | {
                     "bytes": opt.gossip.log[-1]["bytes_per_peer"], "grads_kept": grads_kept})
        opt.zero_grad()
    opt.synchronize()
    out = {"moved": moved, "params": {n: p.detach().numpy().copy() for n, p in named.items()},
           "stats": {k: v for k, v in opt.gossip.stats_dict().items() if k in ("head_steps", "steps")}}
    caramel.shutdown()
    return out


def sparse_adam_worker(rank: int, world: int, steps: int) -> dict:
    """algorithm=momentum with AdamW where one input feature is always zero on rank 0 (as
    digits' border pixels are on some batches): that weight's gradients are zero there and not on
    rank 1. Returns the largest parameter move per step over lr."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    lr = 1e-2
    model, opt = caramel.parallelize(model, torch.optim.AdamW(model.parameters(), lr=lr), "gossip:algorithm=momentum")
    g = torch.Generator().manual_seed(100 + rank)
    moves = []
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
        if rank == 0:
            x[:, 0] = 0.0
        before = [p.detach().clone() for p in model.parameters()]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        opt.synchronize()  # the mix applied, so the move counts it
        moves.append(max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before)))
    caramel.shutdown()
    return {"max_move_over_lr": max(moves) / lr, "finite": all(m == m for m in moves)}


def two_worker_suite(rank: int, world: int, steps: int, cases: tuple[tuple[str, str, str], ...]) -> dict:
    """Everything the 2-worker tests check, in one job (spawning costs more than the checks)."""
    return {"parity": parity_worker(rank, world, steps, cases), "personal": personal_worker(rank, world, steps),
            "sparse_adam": sparse_adam_worker(rank, world, 2 * steps),
            "tensor": tensor_worker(rank, world, steps), "deprl": deprl_worker(rank, world, 6, 2),
            "checkpoint": checkpoint_worker(rank, world, steps, steps // 2, "gossip:algorithm=adam"),
            "checkpoint_overlap": checkpoint_worker(rank, world, steps, steps // 2, "gossip:algorithm=overlap",
                                                    "sgd_momentum"),
            "checkpoint_overlap_momentum": checkpoint_worker(rank, world, steps, steps // 2,
                                                             "gossip:algorithm=overlap_momentum"),
            "checkpoint_debiased": checkpoint_worker(rank, world, steps, steps // 2,
                                                     "gossip:algorithm=adam,second_moment=debiased"),
            "batchnorm": batchnorm_worker(rank, world, steps), "closure": closure_worker(rank, world)}


HALVES_STEPS = 20  # beta2 = 0.95: the EMA's weight is 0.64 on these steps; the sum over workers
# lands within 2% of DDP at 10, 20 and 40 steps, the first-moment product at 0.63-0.64


def four_worker_suite(rank: int, world: int, steps: int, specs: tuple[str, ...]) -> dict:
    """The 4-worker checks, in one job: consensus under lr=0, overlap's, overlap_momentum's and
    the debiased second moment's update by hand, its half-batch cross term against DDP."""
    return {"consensus": consensus_worker(rank, world, steps, specs),
            "overlap_update": overlap_update_worker(rank, world, steps),
            "overlap_adam_update": overlap_adam_update_worker(rank, world, steps),
            "debiased_update": debiased_update_worker(rank, world, steps),
            "halves_vs_ddp": halves_vs_ddp_worker(rank, world, HALVES_STEPS)}
