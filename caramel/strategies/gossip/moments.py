"""Adam's second moment of the workers' average gradient, estimated on each worker
(`second_moment=debiased`): what each worker's Adam divides by, set to an estimate of DDP's.

Under DDP, Adam's second moment averages g-bar^2, the square of the n workers' mean gradient:

    g-bar^2 = (1/n^2) (sum_i g_i^2 + sum_{i != j} g_i g_j),   E[g-bar^2] = mu^2 + s^2 / n

(mu: the mean gradient, s^2: one worker's batch's variance, per coordinate, for disjoint shards
of one distribution). A gossip worker's Adam averages its own g_i^2, E = mu^2 + s^2: larger
wherever the noise matters, so its steps are shorter than DDP's, and averaging the workers'
g_i^2 (algorithm=momentum, overlap_momentum) keeps the same mean. The cross term needs a second
estimate of mu whose noise is independent of g_i(t): the worker's Adam first moment before
this step, m_i(t-1) / (1 - beta1^(t-1)), an average of its earlier gradients (other batches),
so E[g_i(t) m-hat_i(t-1)] = mu^2 where the gradient changes little over Adam's first-moment
window, and its variance is about 1/19 of one gradient's ((1 - beta1) / (1 + beta1); the
previous gradient alone, also measured, is noisier: docs/results/gossip.md). Each worker keeps, at Adam's beta2,

    A_i = EMA(g_i(t)^2)      C_i = EMA(g_i(t) m-hat_i(t-1))      v_i = A_i / n + (1 - 1/n) max(C_i, 0)

and Adam steps with v_i as its exp_avg_sq (its own bias correction and eps apply as usual):
E[v_i] is E[g-bar^2]'s EMA (max: mu^2 >= 0, where the cross term's noise would make it negative).
The first step has no first moment yet: its cross term is g_i^2 (the optimizer's own input).
Nothing travels: no bytes added. The optimizer is torch.optim's Adam or AdamW, whose update
`exp_avg_sq = beta2 exp_avg_sq + (1 - beta2) grad^2` is set up before step() so that it lands
on v_i exactly (float32 state; bf16 state loses about n * 2^-8 of v to the rewrite's
cancellation); Adam's L2 weight decay (coupled, in the gradient) is refused, AdamW's is not in
the moment and is kept. Betas and maximize are read from each parameter's group at every step
(schedules apply); a parameter the optimizer does not hold is skipped, as the optimizer skips it.
A and C live here, not in the optimizer's state: `optimizer.state_dict()` alone does not carry
them, and a step whose Adam state count differs from theirs (such a resume) is an error.

`cross_term=halves`: the partner of the first moment assumes a gradient that changes little over
Adam's window (measured to fail on digits: C came out slightly negative). The same-step
alternative splits the worker's batch in two halves, one backward each (loss of each half its
mean, or both scaled alike): with a and b what the two backward passes add to p.grad,
g = a + b, and a, b independent with mean g's mean / 2, E[4 a b] = mu^2 at this very step, with
no assumption on how the gradient moves. C_i = EMA(4 a b). A hook keeps a after the first
backward and forms 4 a (G - a) after the second; a uniform rescale of a parameter's gradient
between backward and step() (clip_grad_norm_, GradScaler's unscale) is carried over through
|g|^2 / |G|^2; any other edit of p.grad is not. The pass count restarts at step() and at the
optimizer's zero_grad() (a step GradScaler skips on overflow, or a batch dropped before step(),
leaves no stale passes behind). A parameter that one half does not reach (a branch chosen by the
data, an MoE expert) got nothing from it: that half's gradient is exactly 0, so 4 a b = 0 is what
the estimator folds for it (and 0 for a parameter neither half reaches that still has a zeroed
p.grad); a step where no parameter got two passes (one backward) or any got more is an error. Cost: a second, half-sized forward and backward
(the batch's work is the same, in two smaller pieces), one buffer per parameter, a few
elementwise operations; no bytes.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from caramel.errors import CaramelError

SECOND_MOMENTS = ("own", "debiased")
# where the estimate of mu^2 comes from: the first moment of earlier steps, or two halves of this step's batch
CROSS_TERMS = ("first_moment", "halves")


def check_second_moment_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Refuse, before any step, an optimizer whose second moment this cannot set."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise CaramelError(f"strategy 'gossip': second_moment=debiased sets Adam's second moment (exp_avg_sq); pass "
                           f"torch.optim.Adam or AdamW, got {type(optimizer).__name__} (an optimizer without a second "
                           "moment, e.g. SGD, has nothing to debias: leave second_moment=own)")
    for g in optimizer.param_groups:
        if g.get("weight_decay", 0) and not (isinstance(optimizer, torch.optim.AdamW) or g.get("decoupled_weight_decay")):
            raise CaramelError("strategy 'gossip': second_moment=debiased needs the weight decay out of Adam's second "
                               f"moment; Adam's weight_decay={g['weight_decay']} is added to the gradient it squares. "
                               "Use AdamW (or Adam(decoupled_weight_decay=True)), or weight_decay=0")
        if g.get("differentiable"):
            raise CaramelError("strategy 'gossip': second_moment=debiased edits exp_avg_sq in place before the "
                               "update, which a differentiable optimizer would record; use differentiable=False")


class SecondMoment:
    """A_i and C_i of each parameter in `shared` ((name, parameter)), and the step that writes
    v_i into the optimizer's exp_avg_sq (module docstring)."""

    def __init__(self, shared: list[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer, world: int,
                 cross_term: str = "first_moment"):
        if cross_term not in CROSS_TERMS:
            raise CaramelError(f"cross_term must be one of {', '.join(CROSS_TERMS)}, got {cross_term!r}")
        # the parameter's group, read at each step: a schedule may change betas
        self.group = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        held = [(n, p) for n, p in shared if id(p) in self.group]  # the optimizer skips the others
        self.names = [n for n, _ in held]
        self.params = [p for _, p in held]
        self.optimizer, self.world = optimizer, world
        # float32 at least: v is the difference of two sums, and it is compared with zero
        wide = [torch.promote_types(p.dtype, torch.float32) for p in self.params]
        self.sq = [torch.zeros_like(p, dtype=d, memory_format=torch.contiguous_format) for p, d in zip(self.params, wide)]
        self.cross = [torch.zeros_like(s) for s in self.sq]
        # steps folded into A and C, which must be the optimizer's own step count (None: unknown,
        # taken from the optimizer at the next step, for a worker state saved without it)
        self.count: list[int | None] = [0] * len(self.params)
        self.cross_term = cross_term
        # cross_term=halves: backward passes since the last step, the first half's gradient
        # (then 4 a (G - a)) and |G|^2 at the second backward, per parameter
        self.passes = [0] * len(self.params)
        self.halves = [torch.zeros_like(s) for s in self.sq] if cross_term == "halves" else []
        self.total_sq = [torch.zeros((), dtype=s.dtype) for s in self.sq] if cross_term == "halves" else []
        self.handles = ([p.register_post_accumulate_grad_hook(functools.partial(self._half_done, k))
                         for k, p in enumerate(self.params)] if cross_term == "halves" else [])

    def _half_done(self, k: int, p: torch.Tensor) -> None:
        """After each backward's accumulation into p.grad (cross_term=halves): keep the first
        half's gradient a; at the second, form 4 a (G - a) and |G|^2 from the total G."""
        self.passes[k] += 1
        with torch.no_grad():
            G = p.grad.to(self.halves[k].dtype)
            if self.passes[k] == 1:
                self.halves[k].copy_(G)
            elif self.passes[k] == 2:
                self.halves[k].mul_(G - self.halves[k]).mul_(4.0)
                self.total_sq[k] = G.square().sum()

    def observe(self) -> None:
        """At step(), before the optimizer's update (and before anything replaces p.grad): fold
        each worker's own gradient into A and C, C against the first moment of the steps before."""
        if self.cross_term == "halves":
            self.check_passes()
        with torch.no_grad():
            for k, p in enumerate(self.params):
                if p.grad is None:
                    continue
                g = p.grad.to(self.sq[k].dtype)
                group = self.group[id(p)]
                b1, b2 = group["betas"]
                state = self.optimizer.state.get(p)
                steps = int(float(state["step"])) if state and "step" in state else 0
                if self.count[k] is None:
                    self.count[k] = steps
                if self.count[k] != steps:
                    raise CaramelError(
                        f"strategy 'gossip': second_moment=debiased: parameter '{self.names[k]}' has {steps} Adam "
                        f"steps but its second-moment estimate has {self.count[k]}; optimizer.state_dict() does not "
                        "carry the estimate: resume with opt.gossip.worker_state() / load_worker_state()")
                self.count[k] += 1
                self.sq[k].mul_(b2).addcmul_(g, g, value=1 - b2)
                if self.cross_term == "halves":
                    self.cross[k].mul_(b2).add_(self._half_product(k, g), alpha=1 - b2)
                    continue
                if state and "exp_avg" in state:
                    sign = -1.0 if group.get("maximize") else 1.0  # under maximize Adam's m averages -g
                    partner = state["exp_avg"].to(g.dtype).div(sign * (1 - b1 ** float(state["step"])))
                else:
                    partner = g  # no earlier gradient: the optimizer's own g^2
                self.cross[k].mul_(b2).addcmul_(g, partner, value=1 - b2)
        self.reset_passes()

    def reset_passes(self) -> None:
        """Start a new step's count of backward passes (at step() and at the optimizer's zero_grad())."""
        self.passes = [0] * len(self.params)

    def check_passes(self) -> None:
        """cross_term=halves: refuse a step that was not two backward passes (module docstring)."""
        most = max(self.passes, default=2)
        if most == 2 or (most == 0 and not any(p.grad is not None for p in self.params)):
            return
        k = self.passes.index(most)
        if most > 2:
            raise CaramelError(
                f"strategy 'gossip': cross_term=halves takes this step's gradient in two halves, one backward "
                f"each (each half's loss its mean), and parameter '{self.names[k]}' got {most} backward passes "
                "since the last step() or zero_grad(); call backward exactly twice per step")
        raise CaramelError(
            f"strategy 'gossip': cross_term=halves takes this step's gradient in two halves, one backward each "
            f"(each half's loss its mean), and no parameter got two backward passes since the last step() or "
            f"zero_grad() (parameter '{self.names[k]}' got {most}); call backward exactly twice per step")

    def _half_product(self, k: int, g: torch.Tensor) -> torch.Tensor:
        """4 a b of this step (cross_term=halves), in the units of the gradient the optimizer
        steps with: rescaled by |g|^2 / |G|^2 where p.grad was rescaled after backward."""
        if self.passes[k] < 2:  # a half that did not reach p: its gradient, hence 4 a b, is 0
            return torch.zeros_like(self.halves[k])
        total = float(self.total_sq[k])
        scale = float(g.square().sum()) / total if total > 0 else 1.0
        return self.halves[k] if scale == 1.0 else self.halves[k] * scale

    def set_up(self) -> None:
        """Just before the optimizer's step(): set each exp_avg_sq so that its update with
        p.grad (whatever the optimizer is about to step with) gives v_i. A parameter without
        optimizer state yet (its first step) keeps the optimizer's own input, g^2 (= v_i then)."""
        n = self.world
        with torch.no_grad():
            for k, p in enumerate(self.params):
                state = self.optimizer.state.get(p)
                if p.grad is None or not state or "exp_avg_sq" not in state:
                    continue
                b2 = self.group[id(p)]["betas"][1]
                v = self.cross[k].clamp(min=0).mul_(1 - 1 / n).add_(self.sq[k], alpha=1 / n)
                d = p.grad.to(v.dtype)
                # exp_avg_sq <- (v - (1 - b2) d^2) / b2, so that b2 * it + (1 - b2) d^2 = v
                state["exp_avg_sq"].copy_(v.addcmul_(d, d, value=-(1 - b2)).div_(b2))

    def state_dict(self) -> dict[str, Any]:
        return {"sq": {n: t.clone() for n, t in zip(self.names, self.sq)},
                "cross": {n: t.clone() for n, t in zip(self.names, self.cross)},
                "count": dict(zip(self.names, self.count))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        absent = [key for key in ("sq", "cross") if not isinstance(state, dict) or not isinstance(state.get(key), dict)]
        if absent:
            raise CaramelError(f"strategy 'gossip': this worker state's second-moment estimate has no "
                               f"{' or '.join(repr(k) for k in absent)} mapping of parameter names to tensors "
                               f"(keys: {sorted(state) if isinstance(state, dict) else type(state).__name__})")
        missing = [n for n in self.names if n not in state["sq"] or n not in state["cross"]]
        if missing:
            raise CaramelError(f"strategy 'gossip': this worker state's second-moment estimate has no parameter "
                               f"'{missing[0]}' ({len(missing)} missing): it was saved for another model or "
                               "another set of shared parameters")
        for k, n in enumerate(self.names):
            for key in ("sq", "cross"):
                t = state[key][n]
                if not isinstance(t, torch.Tensor) or t.shape != self.sq[k].shape:
                    got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                    raise CaramelError(f"strategy 'gossip': this worker state's second-moment {key!r} of parameter "
                                       f"'{n}' is {got}, expected a tensor of shape {tuple(self.sq[k].shape)}: it "
                                       "was saved for another model")
        counts = state.get("count", {})
        with torch.no_grad():
            for k, n in enumerate(self.names):
                self.sq[k].copy_(state["sq"][n])
                self.cross[k].copy_(state["cross"][n])
                self.count[k] = counts.get(n)
