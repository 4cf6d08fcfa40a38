"""Worker functions of the gossip strategy's overlap tests (spawned; must be importable):
algorithm=overlap and overlap_momentum checked against updates computed by hand (SGD with
momentum and decay, AdamW with mixed moments), BatchNorm statistics under the mix, and the
refused optimizer.step(closure).

Kept apart from `gossip_workers.py` (parity, consensus, personalization, checkpoints), whose
two- and four-worker suites call these; `gossip_workers` re-exports them under their old names.
"""
from __future__ import annotations

import copy

import torch

import caramel
from tests.distributed.workers import batch, fresh, make_optimizer, max_diff


def batchnorm_worker(rank: int, world: int, steps: int) -> dict:
    """algorithm=overlap on a Linear-BatchNorm-Linear model whose inputs' mean drifts every step.
    With lr=0, per step, how far the running statistics land from the hand-computed
    b_i(k+1) = sum_j W_ij b_j(k) + (b_i after step k's forward - b_i(k)): the mix of what was
    sent plus this step's own update (which a mix set in place of the buffer would drop).
    Then the same model trained (lr > 0) straight and resumed from a worker state: the
    parameters and buffers must be equal, bit for bit."""
    from caramel.strategies.gossip.topology import mixing_matrix

    spec, W = "gossip:algorithm=overlap", mixing_matrix("ring", world, 0)

    def data(step: int) -> torch.Tensor:
        return torch.randn(16, 4, generator=torch.Generator().manual_seed(100 * step + rank)) + 3.0 * (step + 1)

    def make(lr: float):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        return (m, *caramel.parallelize(m, torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9), spec))

    m, model, opt = make(0.0)
    stats = [(n, b) for n, b in m.named_buffers() if b.is_floating_point()]
    errors, first = [], {n: b.clone() for n, b in stats}
    for step in range(steps):
        sent = {n: b.clone() for n, b in stats}
        every = {}
        for n, b in stats:
            every[n] = [torch.empty_like(b) for _ in range(world)]
            torch.distributed.all_gather(every[n], b)
        model(data(step)).sum().backward()
        expected = {n: b + (sum(float(W[rank, j]) * every[n][j] for j in range(world)) - sent[n] if step else 0.0)
                    for n, b in stats}
        opt.step()
        opt.zero_grad()
        errors.append(max(float((b - expected[n]).abs().max()) for n, b in stats))
    moved = float((m[1].running_mean - first["1.running_mean"]).abs().max())
    caramel.shutdown()

    def run(stop: int, state=None):
        m, model, opt = make(0.05)
        first = 0
        if state is not None:
            opt.gossip.load_worker_state(state[0])
            first = state[1]
        for step in range(first, stop):
            model(data(step)).sum().backward()
            opt.step()
            opt.zero_grad()
        saved = (opt.gossip.worker_state(), stop)
        return [t.detach().clone() for t in m.state_dict().values()], saved

    straight, _ = run(steps)
    caramel.shutdown()
    _, saved = run(steps // 2)
    caramel.shutdown()
    resumed, _ = run(steps, copy.deepcopy(saved))
    caramel.shutdown()
    return {"errors": errors, "moved": moved, "resume_diff": max_diff(straight, resumed)}


def closure_worker(rank: int, world: int) -> str | None:
    """algorithm=overlap and optimizer.step(closure): the error, if any."""
    from caramel.errors import CaramelError

    w = fresh("gpt_tied")
    opt, _ = make_optimizer("sgd_momentum", w.model.parameters())
    model, opt = caramel.parallelize(w.model, opt, "gossip:algorithm=overlap")
    x, y = batch("gpt_tied", 0, rank)
    try:
        opt.step(lambda: w.loss_fn(model(x), y))
        error = None
    except CaramelError as e:
        error = str(e)
    caramel.shutdown()
    return error


def overlap_update_worker(rank: int, world: int, steps: int) -> dict:
    """algorithm=overlap with SGD (momentum, weight decay) on a ring, `PERSONAL` kept local: per
    step, how far each parameter lands from the hand-computed x_i(k+1) = sum_j W_ij x_j(k) -
    lr d_i(k), with d_i(k) = mu d_i(k-1) + g_i(k) + wd (W x(k))_i (the gradient at the worker's
    own un-mixed x_i(k); the decay at the point updated; W = identity for local parameters).
    The decay is large (0.5) so that decay at x_i(k) instead, lr wd |W x - x| away
    (`decay_gap`), lands past the test's tolerance."""
    from caramel.strategies.gossip.topology import mixing_matrix
    from tests.strategies.gossip.gossip_workers import PERSONAL

    spec = "gossip:topology=ring,algorithm=overlap"
    w = fresh("gpt_tied")
    opt = torch.optim.SGD(w.model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
    mu, wd = opt.param_groups[0]["momentum"], opt.param_groups[0]["weight_decay"]
    model, opt = caramel.parallelize(w.model, opt, spec, personalize=PERSONAL, consensus_every=1)
    named = list(w.model.named_parameters())
    W = mixing_matrix("ring", world, 0)
    d_prev: dict[str, torch.Tensor] = {}
    errors, mixed_moves, decay_gaps = [], [], []
    for step in range(steps):
        x, y = batch("gpt_tied", step, rank)
        w.loss_fn(model(x), y).backward()
        lr = opt.param_groups[0]["lr"]
        worst, moved, gap = 0.0, 0.0, 0.0
        expected = {}
        for n, p in named:
            every = [torch.empty_like(p) for _ in range(world)]
            torch.distributed.all_gather(every, p.detach())
            local = n.startswith(PERSONAL)
            wx = p.detach().clone() if local else sum(float(W[rank, j]) * every[j] for j in range(world))
            d = p.grad + wd * wx + (mu * d_prev[n] if n in d_prev else 0.0)
            d_prev[n] = d
            expected[n] = wx - lr * d
            moved = max(moved, float((wx - p.detach()).abs().max()))
            gap = max(gap, lr * wd * float((wx - p.detach()).abs().max()))
        opt.step()
        sched.step()
        opt.zero_grad()
        for n, p in named:
            worst = max(worst, float((p.detach() - expected[n]).abs().max()))
        errors.append(worst)
        mixed_moves.append(moved)
        decay_gaps.append(gap)
    stats = opt.gossip.stats_dict()
    caramel.shutdown()
    return {"errors": errors, "mix_moved": mixed_moves, "decay_gap": decay_gaps, "consensus": stats["consensus"]}


def overlap_adam_update_worker(rank: int, world: int, steps: int) -> dict:
    """algorithm=overlap_momentum with AdamW (weight decay) on a 4-worker ring, by hand: per
    step, with every worker's x, m, v gathered just before optimizer.step() (the un-mixed values
    of the last step) and g this worker's gradient at its own x:
        m = b1 (W m)_i + (1 - b1) g,  v = b2 (W v)_i + (1 - b2) g^2  (W m = W v = 0 at the first step)
        x = (W x)_i (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    `errors`: the worst distance of x, m, v from that; `unmixed_gap`: how far the same update with
    this worker's own m, v (algorithm=overlap's) lands, so the check can tell the moments were mixed."""
    from caramel.strategies.gossip.topology import mixing_matrix

    w = fresh("gpt_tied")
    opt = torch.optim.AdamW(w.model.parameters(), lr=0.01, weight_decay=0.5)
    (b1, b2), eps, wd = opt.param_groups[0]["betas"], opt.param_groups[0]["eps"], opt.param_groups[0]["weight_decay"]
    model, opt = caramel.parallelize(w.model, opt, "gossip:topology=ring,algorithm=overlap_momentum")
    params = [p for _, p in w.model.named_parameters()]
    W = mixing_matrix("ring", world, 0)

    def mixed(t: torch.Tensor) -> torch.Tensor:
        every = [torch.empty_like(t) for _ in range(world)]
        torch.distributed.all_gather(every, t.detach().contiguous())
        return sum(float(W[rank, j]) * every[j] for j in range(world))

    errors, gaps = [], []
    for step in range(steps):
        x, y = batch("gpt_tied", step, rank)
        w.loss_fn(model(x), y).backward()
        lr, t = opt.param_groups[0]["lr"], step + 1
        expected, gap = [], 0.0
        for p in params:
            st = opt.state.get(p, {})
            own_m, own_v = (st["exp_avg"].clone(), st["exp_avg_sq"].clone()) if st else (torch.zeros_like(p),) * 2
            wx, wm, wv = mixed(p), mixed(own_m), mixed(own_v)
            g = p.grad.detach()

            def update(m0, v0):
                m, v = b1 * m0 + (1 - b1) * g, b2 * v0 + (1 - b2) * g * g
                return wx * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps), m, v
            expected.append(update(wm, wv))
            gap = max(gap, float((update(own_m, own_v)[0] - expected[-1][0]).abs().max()))
        opt.step()
        opt.zero_grad()
        worst = 0.0
        for p, (ex, em, ev) in zip(params, expected):
            st = opt.state[p]
            worst = max(worst, float((p.detach() - ex).abs().max()), float((st["exp_avg"] - em).abs().max()),
                        float((st["exp_avg_sq"] - ev).abs().max()))
        errors.append(worst)
        gaps.append(gap)
    stats = opt.gossip.stats_dict()
    caramel.shutdown()
    return {"errors": errors, "unmixed_gap": gaps, "bytes": stats["bytes_per_peer_per_step"],
            "param_bytes": sum(p.numel() * p.element_size() for p in params)}
