"""How far `second_moment=debiased`'s v is from DDP's own second moment, on DDP's digits
trajectory, in one process (no distributed run; a diagnostic of the estimator, not of gossip).

DDP is replayed in one process: n quarter-batches each take their own backward, the model steps
by AdamW on their mean with `caramel train`'s warm-up + cosine schedule and its data split. Beside
it each of the n workers keeps the estimator of caramel/strategies/gossip/moments.py (A_i =
EMA(g_i^2), C_i = EMA(g_i(t) m-hat_i(t-1)) against its own Adam first moment, v_i = A_i/n +
(1 - 1/n) max(C_i, 0)), and O = EMA(g-bar^2) is DDP's own. Per window of steps (sampled every 5
steps, averaged over workers): sum(v)/sum(O) (below 1: v is low, the worker steps longer than
DDP), sum(max(C, 0)) / sum(mu^2) and sum(C) / sum(mu^2) (unclamped: the clamp alone turns noise
around zero into a positive sum), with mu^2 = (n O - mean A)/(n - 1), the squared mean gradient
that O and A imply (E[O] = mu^2 + s^2/n, E[A] = mu^2 + s^2). The replay draws its own data order
(randperm from the seed), so it is a DDP trajectory on the runs' split, not the runs' trajectory.
`--cross-term halves`: each worker's batch takes two backward passes, one per half (h1, h2 their
mean-loss gradients, g_i = (h1 + h2)/2), and C_i = EMA(h1 h2) (`cross_term=halves`: 4 a b with
a = h1/2, b = h2/2); DDP steps on the same mean gradient. Both estimators are re-derived here,
not called from moments.py: its SecondMoment is bound to one worker's parameters (hooks on them)
and that worker's Adam (its step count), where the replay runs all n workers' passes through one
model and one optimizer; moments.py's own arithmetic is checked by
tests/strategies/gossip/test_moments_halves.py (4 a b by hand) and the 4-worker gloo check
(moments_workers.py, debiased_update_worker: the first-moment update by hand).

    PYTHONPATH=. python experiments/gossip_moment_bias.py --seeds 0,1,2 --json docs/results/gossip-moment-bias.json
    PYTHONPATH=. python experiments/gossip_moment_bias.py --seeds 0,1,2 --cross-term halves \
        --json docs/results/gossip-moment-bias-halves.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from caramel.train.config import TrainConfig, apply_dict  # noqa: E402
from caramel.train.loop import lr_factor  # noqa: E402
from caramel.train.workloads import build_workload  # noqa: E402

SAMPLE_EVERY_STEPS = 5  # the ratios are sums over every parameter: sampled, not computed each step


def run(seed: int, n: int, val_fraction: float, window_steps: int, halves: bool = False) -> list[dict]:
    """One DDP trajectory; per window the mean of the two ratios (module docstring)."""
    cfg = apply_dict(TrainConfig(), {"run": {"workload": "digits", "seed": seed},
                                     "data": {"val_fraction": val_fraction}}, "gossip_moment_bias")
    torch.manual_seed(seed)
    wl = build_workload(cfg)
    model, params = wl.model, [p for p in wl.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    b1, b2 = opt.param_groups[0]["betas"]
    bs = cfg.data.batch_size
    A, C, M = ([[torch.zeros_like(p) for p in params] for _ in range(n)] for _ in range(3))
    O = [torch.zeros_like(p) for p in params]
    gen = torch.Generator().manual_seed(seed)
    order, pos, acc, rows = torch.randperm(len(wl.train_set), generator=gen), 0, [], []
    model.train()
    for step in range(cfg.run.steps):
        if pos + n * bs > len(order):
            order, pos = torch.randperm(len(wl.train_set), generator=gen), 0
        grads, pairs = [], []
        for i in range(n):
            x, y = wl.train_set.batch(order[pos + i * bs: pos + (i + 1) * bs])
            if halves:
                h = []
                for part in (slice(0, bs // 2), slice(bs // 2, None)):
                    model.zero_grad()
                    wl.loss_fn(model(x[part]), y[part]).backward()
                    h.append([p.grad.detach().clone() for p in params])
                grads.append([(u + w) / 2 for u, w in zip(*h)])
                pairs.append([u * w for u, w in zip(*h)])
                continue
            model.zero_grad()
            wl.loss_fn(model(x), y).backward()
            grads.append([p.grad.detach().clone() for p in params])
        pos, t = pos + n * bs, step + 1
        mean_grads = update_moments(A, C, M, O, grads, t, b1, b2, pairs or None)
        for p, g in zip(params, mean_grads):
            p.grad = g.clone()
        for group in opt.param_groups:
            group["lr"] = cfg.optim.lr * lr_factor(cfg, step)
        opt.step()
        if t % SAMPLE_EVERY_STEPS == 0:
            acc.extend(ratios(A, C, O))
        if t % window_steps == 0:
            rows.append({"steps": [t - window_steps + 1, t], "v_over_ddp": statistics.fmean(r[0] for r in acc),
                         "mu2_estimate_over_implied": statistics.fmean(r[1] for r in acc),
                         "unclamped_c_over_implied": statistics.fmean(r[2] for r in acc)})
            acc = []
    return rows


@torch.no_grad()
def update_moments(A: list, C: list, M: list, O: list, grads: list, t: int, b1: float, b2: float,
                   pairs: list | None = None) -> list:
    """One step of every worker's estimator (A, C against its own bias-corrected first moment of
    the steps before, moments.py's partner; g itself at t=1; or, given `pairs`, C of the two
    halves' product h1 h2) and of DDP's O; returns the mean gradient, the one DDP steps on."""
    n = len(grads)
    for i in range(n):
        for k, g in enumerate(grads[i]):
            A[i][k].mul_(b2).addcmul_(g, g, value=1 - b2)
            if pairs is not None:
                C[i][k].mul_(b2).add_(pairs[i][k], alpha=1 - b2)
            else:
                partner = M[i][k] / (1 - b1 ** (t - 1)) if t > 1 else g
                C[i][k].mul_(b2).addcmul_(g, partner, value=1 - b2)
            M[i][k].mul_(b1).add_(g, alpha=1 - b1)
    mean_grads = []
    for k in range(len(O)):
        g = sum(grads[i][k] for i in range(n)) / n
        O[k].mul_(b2).addcmul_(g, g, value=1 - b2)
        mean_grads.append(g)
    return mean_grads


@torch.no_grad()
def ratios(A: list, C: list, O: list) -> list[tuple[float, float, float]]:
    """Per worker: sum(v)/sum(O), sum(max(C, 0))/sum(mu^2) and sum(C)/sum(mu^2), mu^2 the squared
    mean gradient that O and the workers' mean A imply (module docstring)."""
    n = len(A)
    o = torch.cat([x.flatten() for x in O])
    a_mean = torch.cat([(sum(A[i][k] for i in range(n)) / n).flatten() for k in range(len(O))])
    mu2 = ((n * o - a_mean) / (n - 1)).clamp(min=0)
    out = []
    for i in range(n):
        a = torch.cat([x.flatten() for x in A[i]])
        c_raw = torch.cat([x.flatten() for x in C[i]])
        c = c_raw.clamp(min=0)
        out.append((float((a / n + (1 - 1 / n) * c).sum() / o.sum()), float(c.sum() / mu2.sum()),
                    float(c_raw.sum() / mu2.sum())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--val-fraction", type=float, default=0.3)
    ap.add_argument("--window-steps", type=int, default=40)
    ap.add_argument("--cross-term", choices=("first_moment", "halves"), default="first_moment",
                    help="the estimator's cross term: Adam's first moment of earlier steps, or two half batches")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if args.workers < 2:
        raise SystemExit(f"--workers {args.workers}: expected 2 or more (one worker has nothing to debias)")
    steps = TrainConfig().run.steps
    if args.cross_term == "halves" and TrainConfig().data.batch_size % 2:
        raise SystemExit(f"--cross-term halves: the batch size {TrainConfig().data.batch_size} is odd")
    if args.window_steps < SAMPLE_EVERY_STEPS or args.window_steps % SAMPLE_EVERY_STEPS or steps % args.window_steps:
        raise SystemExit(f"--window-steps {args.window_steps}: expected a multiple of {SAMPLE_EVERY_STEPS} "
                         f"that divides the {steps} training steps (else the last steps fall out of every window)")
    out = {}
    for seed in seeds:
        out[str(seed)] = run(seed, args.workers, args.val_fraction, args.window_steps, args.cross_term == "halves")
        for r in out[str(seed)]:
            print(f"seed {seed} steps {r['steps'][0]}-{r['steps'][1]}: v / DDP's {r['v_over_ddp']:.3f}, "
                  f"mu^2 estimate / implied {r['mu2_estimate_over_implied']:.3f} "
                  f"(unclamped C {r['unclamped_c_over_implied']:+.3f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": "python experiments/gossip_moment_bias.py " + " ".join(sys.argv[1:]),
                                               "workers": args.workers, "val_fraction": args.val_fraction,
                                               "cross_term": args.cross_term,
                                               "seeds": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
