"""Worker function of the gossip strategy's debiased second moment test (spawned; must be
importable): `second_moment=debiased` on a 4-worker ring checked against AdamW computed by hand,
and its half-batch cross term against DDP's second moment."""
from __future__ import annotations

import copy

import torch

import caramel
from tests.distributed.workers import batch, fresh


def debiased_update_worker(rank: int, world: int, steps: int) -> dict:
    """dpsgd ring, AdamW (weight decay), second_moment=debiased, by hand: per step, with x this
    worker's parameters once the last step's mix has landed and g its gradient at x,
        A = b2 A + (1 - b2) g^2,  C = b2 C + (1 - b2) g m / (1 - b1^(t-1))  (g^2 at the first step)
        v = A / n + (1 - 1/n) max(C, 0),  then m = b1 m + (1 - b1) g
        x = x (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    `errors`: the worst distance of x and exp_avg_sq from that; `own_gap`: how far AdamW's own
    update (v of g^2) lands, so the check can tell; `clamped`: coordinates where C < 0 (the max
    is exercised); `bytes`: sent per peer per step (the parameters only)."""
    w = fresh("gpt_tied")
    opt = torch.optim.AdamW(w.model.parameters(), lr=0.01, weight_decay=0.5)
    (b1, b2), eps, wd = opt.param_groups[0]["betas"], opt.param_groups[0]["eps"], opt.param_groups[0]["weight_decay"]
    model, opt = caramel.parallelize(w.model, opt, "gossip:topology=ring,second_moment=debiased")
    params = [p for _, p in w.model.named_parameters()]
    zeros = [torch.zeros_like(p) for p in params]
    A, C, m, own_v = ([z.clone() for z in zeros] for _ in range(4))
    errors, sq_errors, gaps, clamped = [], [], [], 0
    for step in range(steps):
        x, y = batch("gpt_tied", step, rank)
        w.loss_fn(model(x), y).backward()
        opt.synchronize()  # the last step's mix lands now rather than inside step(): the same x
        lr, t = opt.param_groups[0]["lr"], step + 1
        expected, gap = [], 0.0
        for k, p in enumerate(params):
            g, x0 = p.grad.detach().clone(), p.detach().clone()
            A[k] = b2 * A[k] + (1 - b2) * g * g
            C[k] = b2 * C[k] + (1 - b2) * g * (m[k] / (1 - b1 ** step) if step else g)
            clamped += int((C[k] < 0).sum())
            v = A[k] / world + (1 - 1 / world) * C[k].clamp(min=0)
            m[k] = b1 * m[k] + (1 - b1) * g
            own_v[k] = b2 * own_v[k] + (1 - b2) * g * g

            def update(v):
                return x0 * (1 - lr * wd) - lr * (m[k] / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
            expected.append((update(v), v))
            gap = max(gap, float((update(own_v[k]) - expected[-1][0]).abs().max()))
        opt.step()
        opt.zero_grad()
        worst, worst_sq = 0.0, 0.0
        for p, (ex, ev) in zip(params, expected):
            worst = max(worst, float((p.detach() - ex).abs().max()))
            # relative: v is 1e-5 at most here, an absolute bound would hold for any v
            worst_sq = max(worst_sq, float(((opt.state[p]["exp_avg_sq"] - ev).abs() / (ev.abs() + 1e-15)).max()))
        errors.append(worst)
        sq_errors.append(worst_sq)
        gaps.append(gap)
    stats = opt.gossip.stats_dict()
    caramel.shutdown()
    return {"errors": errors, "sq_errors": sq_errors, "own_gap": gaps, "clamped": clamped, "bytes": stats["bytes_per_peer_per_step"],
            "param_bytes": sum(p.numel() * p.element_size() for p in params)}


HALVES_L2 = 0.04  # L2^2 |x|^2 is about a quarter of one 2-sample batch's |g|^2 (2.7) on gpt_tied


def _common(model: torch.nn.Module) -> torch.Tensor:
    """A loss term whose gradient (HALVES_L2 x) is the same on every worker and half: a mean gradient."""
    return HALVES_L2 / 2 * sum(p.square().sum() for p in model.parameters())


def halves_vs_ddp_worker(rank: int, world: int, steps: int) -> dict:
    """cross_term=halves against DDP's own second moment, at fixed parameters (lr = 0: the model
    never moves): a 4-worker ring, each worker's batch in two halves (one backward each), beside
    torch's DDP on the same batches. At lr = 0 alone the first-moment partner is unbiased too, and
    on these 2-sample batches the mean gradient is nothing against the noise (mu^2 ~ 0: any C near
    0 would pass), so the loss gets a term common to all workers, L2 / 2 |x|^2 (gradient L2 x, the
    same for every half and worker: mu^2 about s^2 / 4), and its sign flips every step (as in
    test_moments_halves): 4 a b and g^2 are unchanged, but the first moment of earlier steps
    cancels to about -mu / 19, so that estimator misses DDP by about mu^2 (3/4) and fails.
    Returns each worker's exp_avg_sq summed over all parameters after `steps` steps, DDP's (the
    EMA of the workers' mean gradient squared), the estimate before its clamp (A / n + (1 - 1/n) C,
    the part whose mean is DDP's) and the worker's own A (the EMA of g_i^2: what its Adam would
    divide by without the option)."""
    w = fresh("gpt_tied")
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.model))
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=0.0, betas=(0.9, 0.95), weight_decay=0.0)
    opt = torch.optim.AdamW(w.model.parameters(), lr=0.0, betas=(0.9, 0.95), weight_decay=0.0)
    model, opt = caramel.parallelize(w.model, opt, "gossip:topology=ring,second_moment=debiased,cross_term=halves")
    for step in range(steps):
        x, y = batch("gpt_tied", step, rank)
        half = x.shape[0] // 2
        sign = (-1.0) ** step
        for part in (slice(0, half), slice(half, None)):
            (sign * (w.loss_fn(model(x[part]), y[part]) + _common(w.model)) / 2).backward()
        opt.step()
        opt.zero_grad()
        (sign * (w.loss_fn(ddp(x), y) + _common(ddp.module))).backward()
        ddp_opt.step()
        ddp_opt.zero_grad()
    mine = sum(float(opt.state[p]["exp_avg_sq"].sum()) for p in w.model.parameters())
    theirs = sum(float(ddp_opt.state[p]["exp_avg_sq"].sum()) for p in ddp.parameters())
    est = opt.gossip.moments
    own = sum(float(a.sum()) for a in est.sq)
    unclamped = sum(float((a / world + (1 - 1 / world) * c).sum()) for a, c in zip(est.sq, est.cross))
    caramel.shutdown()
    return {"halves": mine, "unclamped": unclamped, "ddp": theirs, "own": own}
