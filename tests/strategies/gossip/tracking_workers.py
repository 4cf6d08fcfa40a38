"""Worker functions of the gradient-tracking tests (algorithm=tracking; spawned, so importable)."""
from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist

import caramel
from caramel.errors import CaramelError
from tests.distributed.workers import batch, fresh, make_optimizer, max_diff, params_of, train
from tests.strategies.gossip.gossip_workers import checkpoint_worker

RING = "gossip:topology=ring,algorithm=tracking"


def invariant_worker(rank: int, world: int, steps: int) -> dict:
    """Float64 branchy MLP (one Linear never used: no gradient anywhere) on a ring: after every
    step, the trackers' sum against the gradients' sum, how far a tracker is from the average
    gradient and from its own, and whether the user's gradients are back after step()."""
    w = fresh("mlp_unused")
    m = w.model.double()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    model, opt = caramel.parallelize(m, opt, RING)
    tracker = opt.gossip.tracker
    out = {"sum_gap": [], "from_mean": [], "from_own": [], "grads_kept": [], "scale": [], "skipped_unused": True}
    for step in range(steps):
        x, y = batch("mlp_unused", step, rank)
        w.loss_fn(model(x.double()), y).backward()
        grads = [None if p.grad is None else p.grad.clone() for p in tracker.params]
        unused = [p.detach().clone() for p in m.unused.parameters()]
        opt.step()
        out["grads_kept"].append(all((g is None and p.grad is None) or (g is not None and torch.equal(g, p.grad))
                                     for g, p in zip(grads, tracker.params)))
        out["skipped_unused"] &= all(torch.equal(a, p) for a, p in zip(unused, m.unused.parameters()))
        own = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, tracker.params)])
        ys = torch.cat([t.reshape(-1) for t in tracker.y])
        gap, mean = ys - own, own.clone()
        dist.all_reduce(gap)  # sum_i y_i - sum_i g_i
        dist.all_reduce(mean)
        mean /= world
        out["sum_gap"].append(float(gap.abs().max()))
        out["scale"].append(float(own.abs().max()))
        out["from_mean"].append(float((ys - mean).abs().max()))
        out["from_own"].append(float((ys - own).abs().max()))
        opt.zero_grad()
    out["bytes_per_peer"] = opt.gossip.stats_dict()["bytes_per_peer_per_step"]
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())
    caramel.shutdown()
    return out


def complete_worker(rank: int, world: int, steps: int) -> dict:
    """AdamW on the complete graph: tracking's trackers are the average gradient, so every worker
    takes DDP's step (with or without the moments mixed); dpsgd's local Adam does not."""
    w = fresh("gpt_tied")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ropt, rsched = make_optimizer("adamw", ddp.parameters())
    train(ddp, ropt, rsched, w.loss_fn, "gpt_tied", rank, steps)
    out = {}
    for algorithm in ("tracking", "tracking_momentum", "dpsgd"):
        m = copy.deepcopy(w.model)
        opt, sched = make_optimizer("adamw", m.parameters())
        model, opt = caramel.parallelize(m, opt, f"gossip:topology=complete,algorithm={algorithm}")
        train(model, opt, sched, w.loss_fn, "gpt_tied", rank, steps)
        opt.synchronize()
        out[algorithm] = {"ddp": max_diff(params_of(ddp.module), params_of(m)),
                          "moved": max_diff(params_of(w.model), params_of(m)),
                          "bytes": opt.gossip.stats_dict()["bytes_per_peer_per_step"]}
        caramel.shutdown()
    return out


def refusals_worker(rank: int, world: int) -> dict:
    """A closure, and a worker state saved without a tracker, each get one clear error."""
    out = {}
    w = fresh("gpt_tied")
    opt, _ = make_optimizer("adamw", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, RING)
    try:
        opt.step(lambda: w.loss_fn(model(*batch("gpt_tied", 0, rank)[:1]), batch("gpt_tied", 0, rank)[1]))
    except CaramelError as e:
        out["closure"] = str(e)
    caramel.shutdown()
    w = fresh("gpt_tied")
    opt, _ = make_optimizer("adamw", w.model.parameters())
    _, opt = caramel.parallelize(w.model, opt, "gossip:topology=ring")
    state = opt.gossip.worker_state()
    caramel.shutdown()
    w = fresh("gpt_tied")
    opt, _ = make_optimizer("adamw", w.model.parameters())
    _, opt = caramel.parallelize(w.model, opt, RING)
    try:
        opt.gossip.load_worker_state(state)
    except CaramelError as e:
        out["state"] = str(e)
    caramel.shutdown()
    return out


class _AttnNet(torch.nn.Module):
    """nn.MultiheadAttention uses its out_proj's parameters without calling out_proj."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.inp(x)
        h, _ = self.attn(h, h, h)
        return self.head(h).mean(1)


def unrun_child_worker(rank: int, world: int, steps: int) -> dict:
    """Messages cut so that the head's tensors and out_proj's share the last one (3,300 bytes:
    inp | in_proj | head + out_proj): mixed at the head's pre-hook, out_proj's weight would
    change after the attention used it and before backward (autograd refuses)."""
    torch.manual_seed(0)
    m = _AttnNet()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    model, opt = caramel.parallelize(m, opt, "gossip:topology=ring,algorithm=tracking_momentum",
                                     bucket_cap_mb=3300 / 2 ** 20)
    gen = torch.Generator().manual_seed(rank)
    try:
        for _ in range(steps):
            x = torch.randn(2, 3, 8, generator=gen)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        out = {"ok": True, "error": ""}
    except RuntimeError as e:
        out = {"ok": False, "error": str(e)[:200]}
    caramel.shutdown()
    return out


class _Dec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)  # never called: `enc` reads its weight
        self.out = torch.nn.Linear(8, 4)

    def forward(self, h):
        return self.out(h)


class _Enc(torch.nn.Module):
    def __init__(self, dec: _Dec):
        super().__init__()
        self.inp = torch.nn.Linear(8, 8)
        self.dec = [dec]  # a plain list: not a submodule

    def forward(self, x):
        return torch.nn.functional.linear(self.inp(x).tanh(), self.dec[0].proj.weight)


class _EncDec(torch.nn.Module):
    """`enc` reads `dec.proj.weight` without calling `dec.proj`; `dec` runs after `enc`."""

    def __init__(self):
        super().__init__()
        self.dec = _Dec()
        self.enc = _Enc(self.dec)

    def forward(self, x):
        return self.dec(self.enc(x)).mean(0)


def enc_dec_worker(rank: int, world: int, steps: int) -> dict:
    """One tensor per message: `dec.proj.weight` (its module never runs) mixed at `dec`'s
    pre-hook would change after `enc` used it and before backward (autograd refuses)."""
    torch.manual_seed(0)
    m = _EncDec()
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    model, opt = caramel.parallelize(m, opt, "gossip:topology=ring", bucket_cap_mb=1e-6)
    gen = torch.Generator().manual_seed(rank)
    try:
        for _ in range(steps):
            model(torch.randn(3, 8, generator=gen)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        out = {"ok": True, "error": "", "order": list(opt.gossip.order)}
    except RuntimeError as e:
        out = {"ok": False, "error": str(e)[:200], "order": list(opt.gossip.order)}
    caramel.shutdown()
    return out


# (family, optimizer, algorithm, micro-batches per step, how they accumulate, traced)
OVERLAP_CASES = [("gpt_tied", "adamw", "tracking_momentum", 1, "", True),
                 ("cnn_bn", "sgd_momentum", "tracking_momentum", 2, "no_sync", True),
                 ("cnn_bn", "sgd_momentum", "tracking", 2, "plain", False)]


def _train_accumulating(model, opt, sched, loss_fn, family, rank, steps, micro, accumulate):
    for step in range(steps):
        for i in range(micro):
            x, y = batch(family, micro * step + i, rank)
            ctx = model.no_sync() if accumulate == "no_sync" and i < micro - 1 else contextlib.nullcontext()
            with ctx:
                loss_fn(model(x), y).backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def overlap_worker(rank: int, world: int, steps: int, trace_dir: str) -> dict:
    """overlap_trackers (each tracker message sent from the gradient hooks once its gradients are
    final) against the reference path (every tracker formed and sent at step()), on a ring:
    the parameters after `steps` steps, the tracker messages that left in backward, and (traced)
    each step's bytes per link. Gradients accumulated in no_sync() and outside it (messages
    withdrawn and sent again). Then a gradient clipped after backward: refused."""
    out = {}
    for family, kind, algorithm, micro, accumulate, traced in OVERLAP_CASES:
        w = fresh(family)
        res = {}
        for overlap in (False, True):
            m = copy.deepcopy(w.model)
            opt, sched = make_optimizer(kind, m.parameters())
            spec = f"gossip:topology=ring,algorithm={algorithm},overlap_trackers={str(overlap).lower()}"
            trace = f"{trace_dir}/{family}-{algorithm}.json" if overlap and traced else None
            model, opt = caramel.parallelize(m, opt, spec, tracker_bucket_cap_mb=8e-3, trace=trace)
            _train_accumulating(model, opt, sched, w.loss_fn, family, rank, steps, micro, accumulate)
            opt.synchronize()  # writes the trace
            res[overlap] = (params_of(m), opt.gossip.stats_dict())
            caramel.shutdown()
        out[f"{family}-{algorithm}"] = {"diff": max_diff(res[False][0], res[True][0]),
                                        "moved": max_diff(params_of(w.model), res[True][0]),
                                        "in_backward": res[True][1]["tracker_messages_in_backward"],
                                        "reference_in_backward": res[False][1]["tracker_messages_in_backward"],
                                        "steps": res[True][1]["steps"]}
    w = fresh("gpt_tied")
    opt, _ = make_optimizer("adamw", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, "gossip:topology=ring,algorithm=tracking")
    x, y = batch("gpt_tied", 0, rank)
    w.loss_fn(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
    try:
        opt.step()
        out["clipped"] = ""
    except CaramelError as e:
        out["clipped"] = str(e)
    caramel.shutdown()
    return out


class _Branchy(torch.nn.Module):
    """`stem` (its weight frozen), then `body` and `a`, each skipped where a forward says so
    (data-dependent control flow): ranks' first forwards may run different modules."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(4, 4)
        self.body = torch.nn.Linear(4, 4)
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x, use_body=True, use_a=True):
        h = self.stem(x).tanh()
        h = self.body(h) if use_body else h
        return (self.a(h) if use_a else h).pow(2).sum()


# (case, stem.weight frozen, rank 1's first forward skips `a`, micro-batches accumulating outside
# no_sync() with `body` used in the first one on even ranks and in the second on odd ranks)
DIVERGENT_CASES = [("first_forward", False, True, False), ("frozen", True, False, False),
                   ("accumulate", False, False, True)]


def _divergent_loop(rank, case, overlap, steps):
    _, frozen, skip_first, accumulate = next(c for c in DIVERGENT_CASES if c[0] == case)
    torch.manual_seed(0)
    m = _Branchy().double()
    m.stem.weight.requires_grad_(not frozen)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    gaps, scale = [], 0.0
    try:
        model, opt = caramel.parallelize(m, opt, f"gossip:topology=ring,algorithm=tracking,"
                                         f"overlap_trackers={str(overlap).lower()}", tracker_bucket_cap_mb=1e-4,
                                         timeout_s=30)
        tracker = opt.gossip.tracker
        for step in range(steps):
            for micro in range(2 if accumulate else 1):
                use_a = not (skip_first and rank == 1 and step == 0)
                use_body = not accumulate or (micro == 0) == (rank % 2 == 0)
                model(torch.randn(8, 4, generator=gen, dtype=torch.float64), use_body, use_a).backward()
            opt.step()
            opt.zero_grad()
            gap = torch.cat([(y - g).reshape(-1) for y, g in zip(tracker.y, tracker.g_prev)])
            scale = max(scale, float(torch.cat([g.reshape(-1) for g in tracker.g_prev]).abs().max()))
            dist.all_reduce(gap)  # sum_i y_i - sum_i g_i
            gaps.append(float(gap.abs().max()))
        res = {"error": "", "gaps": gaps, "scale": scale, "params": params_of(m), "frozen": m.stem.weight.clone()}
    except Exception as e:  # noqa: BLE001 - reported to the test
        res = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    caramel.shutdown()
    return res


def divergent_worker(rank: int, world: int, steps: int) -> dict:
    """Ranks that run different modules (a first forward that skips one, micro-batches
    accumulating outside no_sync() with different parameters touched per rank) and a frozen
    weight, with the trackers overlapped and on the reference path: the tracking invariant and
    the parameters. Then dpsgd on the complete graph with a divergent first forward: every
    rank must hold the same average. Then a clip that never binds: refused on every rank at
    step 0, the trackers untouched."""
    out = {}
    for case, *_ in DIVERGENT_CASES:
        res = {overlap: _divergent_loop(rank, case, overlap, steps) for overlap in (False, True)}
        out[case] = {"errors": [res[False]["error"], res[True]["error"]]}
        if not any(out[case]["errors"]):
            out[case].update(gaps=res[True]["gaps"], ref_gaps=res[False]["gaps"], scale=res[True]["scale"],
                             diff=max_diff(res[False]["params"], res[True]["params"]),
                             frozen_kept=torch.equal(res[True]["frozen"], res[False]["frozen"]))
    torch.manual_seed(0)
    m = _Branchy()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    model, opt = caramel.parallelize(m, opt, "gossip:topology=complete", timeout_s=30)
    gen = torch.Generator().manual_seed(rank)
    for step in range(3):
        model(torch.randn(8, 4, generator=gen), True, not (rank == 1 and step == 0)).backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    mean = flat.clone()
    dist.all_reduce(mean)
    out["dpsgd_spread"] = float((flat - mean / world).abs().max())
    caramel.shutdown()
    torch.manual_seed(0)
    m = _Branchy()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    model, opt = caramel.parallelize(m, opt, RING, timeout_s=30)
    model(torch.randn(8, 4)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)  # never binds: scales by exactly 1
    try:
        opt.step()
        out["late_clip"] = ""
    except CaramelError as e:
        out["late_clip"] = str(e)
    tracker = opt.gossip.tracker
    out["late_clip_untouched"] = (not tracker.exchange.pending
                                  and all(not y.any() and not g.any() for y, g in zip(tracker.y, tracker.g_prev)))
    caramel.shutdown()
    m = _Branchy()
    m.a.weight.requires_grad_(rank != 1)  # frozen on one rank only: its messages would differ
    try:
        caramel.parallelize(m, torch.optim.SGD(m.parameters(), lr=0.1), RING, timeout_s=30)
        out["frozen_on_one_rank"] = ""
    except CaramelError as e:
        out["frozen_on_one_rank"] = str(e)
    caramel.shutdown()
    return out


def four_worker_suite(rank: int, world: int, steps: int, trace_dir: str = "") -> dict:
    """Everything the tracking tests check on 4 workers, in one job (spawning costs more)."""
    return {"overlap": overlap_worker(rank, world, 3 * steps, trace_dir), "invariant": invariant_worker(rank, world, steps), "complete": complete_worker(rank, world, steps),
            "checkpoint": checkpoint_worker(rank, world, steps, steps // 2, RING),
            "refusals": refusals_worker(rank, world), "unrun_child": unrun_child_worker(rank, world, steps),
            "enc_dec": enc_dec_worker(rank, world, steps), "divergent": divergent_worker(rank, world, steps)}
