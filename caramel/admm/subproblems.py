"""dlADMM's subproblems, one function each, on column-major blocks (features x samples).

Every function takes `total`, a reducer that returns the sum of a tensor over all ranks (the
identity on one process). Samples are split across ranks, so anything summed over samples (a
weight gradient, an objective value that decides a backtracking trial) goes through `total`,
and every rank takes the same decision; per-sample quantities (z, a, u) stay local.

The coupling term of layer l is (kappa / 2) ||z_l - W_l a_{l-1} - b_l + shift||^2, with
kappa = nu and shift = 0 for a hidden layer, and kappa = rho and shift = u / rho for the output
layer (the augmented-Lagrangian terms <u, e> + rho/2 ||e||^2 written as one square).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

Reducer = Callable[[torch.Tensor], torch.Tensor]
CE_CURVATURE = 0.5  # Boehning's bound: the softmax cross-entropy's Hessian is at most I / 2


def serial_total(t: torch.Tensor) -> torch.Tensor:
    """The reducer of a single process: the local sum is the total."""
    return t


def residual(z: torch.Tensor, W: torch.Tensor, a_prev: torch.Tensor, b: torch.Tensor, shift: torch.Tensor | None) -> torch.Tensor:
    r = z - W @ a_prev - b
    return r + shift if shift is not None else r


def update_b(z, W, a_prev, shift, n_total: int, total: Reducer) -> torch.Tensor:
    """Exact minimizer over b: the mean over all samples of z - W a (+ shift)."""
    r = z - W @ a_prev
    if shift is not None:
        r = r + shift
    return total(r.sum(dim=1, keepdim=True)) / n_total


def update_W(W, b, z, a_prev, shift, kappa: float, weight_decay: float, theta: float, factor: float,
             total: Reducer) -> tuple[torch.Tensor, float]:
    """One step of W - grad / theta, theta grown until the quadratic approximation with curvature
    theta bounds the objective at the new point (dlADMM's backtracking; a descent step).
    Returns the new W and the accepted theta."""
    r = residual(z, W, a_prev, b, shift)
    packed = total(torch.cat([(-kappa * (r @ a_prev.T)).reshape(-1), (0.5 * kappa * (r * r).sum()).reshape(1)]))
    grad = packed[:-1].reshape(W.shape) + weight_decay * W
    g0 = float(packed[-1]) + 0.5 * weight_decay * float((W * W).sum())
    g2 = float((grad * grad).sum())
    while True:
        W_new = W - grad / theta
        r_new = residual(z, W_new, a_prev, b, shift)
        g_new = float(total((0.5 * kappa * (r_new * r_new).sum()).reshape(1))) + 0.5 * weight_decay * float((W_new * W_new).sum())
        if g_new <= g0 - g2 / (2 * theta) or g2 == 0.0:
            return W_new, theta
        theta *= factor


def a_objective(a, z_l, W_next, b_next, z_next, shift_next, kappa_next: float, nu: float) -> torch.Tensor:
    """Local value of the a_l subproblem: the next layer's coupling plus nu/2 ||a_l - relu(z_l)||^2."""
    r = residual(z_next, W_next, a, b_next, shift_next)
    d = a - torch.relu(z_l)
    return 0.5 * kappa_next * (r * r).sum() + 0.5 * nu * (d * d).sum()


def update_a(a, z_l, W_next, b_next, z_next, shift_next, kappa_next: float, nu: float, tau: float, factor: float,
             total: Reducer) -> tuple[torch.Tensor, float]:
    """One backtracked step on the a_l subproblem (a quadratic whose exact solution needs a
    matrix inverse; the approximation avoids it). One curvature tau for all samples, chosen from
    global objective values so that every rank takes the same step."""
    r = residual(z_next, W_next, a, b_next, shift_next)
    grad = -kappa_next * (W_next.T @ r) + nu * (a - torch.relu(z_l))
    h0, g2 = total(torch.stack([a_objective(a, z_l, W_next, b_next, z_next, shift_next, kappa_next, nu),
                                (grad * grad).sum()])).tolist()
    while True:
        a_new = a - grad / tau
        h_new = float(total(a_objective(a_new, z_l, W_next, b_next, z_next, shift_next, kappa_next, nu).reshape(1)))
        if h_new <= h0 - g2 / (2 * tau) or g2 == 0.0:
            return a_new, tau
        tau *= factor


def update_z_hidden(W, a_prev, b, a_l) -> torch.Tensor:
    """Exact, elementwise minimizer of (z - m)^2 + (a - relu(z))^2 with m = W a_prev + b: the best
    of the two branches z <= 0 (z = min(m, 0)) and z >= 0 (z = max((m + a) / 2, 0))."""
    m = W @ a_prev + b
    z_neg = torch.clamp(m, max=0.0)
    z_pos = torch.clamp((m + a_l) / 2, min=0.0)
    f_neg = (z_neg - m) ** 2 + (a_l - torch.relu(z_neg)) ** 2
    f_pos = (z_pos - m) ** 2 + (a_l - torch.relu(z_pos)) ** 2
    return torch.where(f_pos < f_neg, z_pos, z_neg)


def cross_entropy_sum(z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed softmax cross-entropy of logits z (classes x samples)."""
    return F.cross_entropy(z.T, labels, reduction="sum")


def update_z_out(z, W, a_prev, b, u, labels, onehot, rho: float, steps: int) -> torch.Tensor:
    """The output subproblem CE(z) + <u, z - m> + rho/2 ||z - m||^2, m = W a_prev + b, solved
    per sample by `steps` gradient steps of length 1 / (rho + 1/2) from the current z: the
    objective's curvature is at most rho + 1/2, so every step decreases it."""
    target = W @ a_prev + b - u / rho
    step = 1.0 / (rho + CE_CURVATURE)
    for _ in range(steps):
        grad = torch.softmax(z, dim=0) - onehot + rho * (z - target)
        z = z - step * grad
    return z


EXACT_RIDGE = 1e-6  # the exact solves' ridge when weight_decay is 0: keeps a singular Gram matrix (dead units) solvable


def solve_W(b, z, a_prev, shift, kappa: float, weight_decay: float, total: Reducer) -> torch.Tensor:
    """Exact minimizer over W of the coupling term plus weight decay (normal equations of a ridge
    regression; cubic in the layer's input width, which dlADMM's approximation avoids)."""
    target = z - b if shift is None else z - b + shift
    n_in = a_prev.shape[0]
    packed = total(torch.cat([(a_prev @ a_prev.T).reshape(-1), (target @ a_prev.T).reshape(-1)]))
    gram = packed[: n_in * n_in].reshape(n_in, n_in)
    rhs = packed[n_in * n_in:].reshape(z.shape[0], n_in)
    ridge = (weight_decay or EXACT_RIDGE) / kappa
    chol = torch.linalg.cholesky(gram + ridge * torch.eye(n_in, dtype=gram.dtype))
    return torch.cholesky_solve(rhs.T, chol).T


def solve_a(z_l, W_next, b_next, z_next, shift_next, kappa_next: float, nu: float) -> torch.Tensor:
    """Exact minimizer over a_l (per sample, so no reduction): (kappa W'^T W' + nu I)^-1
    (kappa W'^T (z' - b' + shift') + nu relu(z_l))."""
    target = z_next - b_next if shift_next is None else z_next - b_next + shift_next
    n = W_next.shape[1]
    lhs = kappa_next * (W_next.T @ W_next) + nu * torch.eye(n, dtype=W_next.dtype)
    rhs = kappa_next * (W_next.T @ target) + nu * torch.relu(z_l)
    return torch.cholesky_solve(rhs, torch.linalg.cholesky(lhs))
