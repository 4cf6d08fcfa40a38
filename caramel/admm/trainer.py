"""dlADMM (Wang, Li and Zhao): gradient-free training of a ReLU MLP by ADMM.

Every layer's pre-activation z_l and activation a_l become variables of their own, so the
layers decouple: each update below touches one block and minimizes the augmented Lagrangian
over it, exactly (b, hidden z) or through a quadratic approximation with backtracking (W, a), or
by a few monotone gradient steps (the output z, whose loss is cross-entropy).

One iteration is a backward sweep (output layer to input) then a forward sweep, then the dual
update u += rho (z_L - W_L a_{L-1} - b_L). The hidden constraints are quadratic penalties with
weight nu; the output constraint alone carries a dual (dlADMM's formulation).

    model = DlAdmm(x_train, y_train, classes=10, options=AdmmOptions(hidden=(128,)))
    for _ in range(60): model.iterate()
    accuracy = (model.predict(x_test).argmax(1) == y_test).float().mean()
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from caramel.admm import subproblems as sp
from caramel.admm.options import AdmmOptions
from caramel.errors import CaramelError

Update = tuple[str, int, Callable[[], None]]


class DlAdmm:
    """The variables of one rank's samples (all of them on one process) and the updates.

    Lists are 0-based by layer: W[l], b[l], z[l] for l in 0..L-1 (z[L-1] holds the logits), and
    a[l] is layer l's input (a[0] the data, a[l] = relu(z[l-1]) ideally). Tensors are
    features x samples. `total` sums a tensor over ranks; `n_total` is the global sample count.
    """

    def __init__(self, x: torch.Tensor, labels: torch.Tensor, classes: int, options: AdmmOptions | None = None,
                 total: sp.Reducer = sp.serial_total):
        self.opt = options or AdmmOptions()
        if x.dim() != 2 or labels.dim() != 1 or len(x) != len(labels) or len(x) == 0:
            raise CaramelError(f"dlADMM: expected inputs (samples x features) and labels (samples,), got "
                               f"{tuple(x.shape)} and {tuple(labels.shape)}")
        if classes < 2 or int(labels.min()) < 0 or int(labels.max()) >= classes:
            raise CaramelError(f"dlADMM: labels must lie in 0..{classes - 1} ({classes} classes), "
                               f"got {int(labels.min())}..{int(labels.max())}")
        dtype = getattr(torch, self.opt.dtype)
        self.total = total
        self.n_total = int(total(torch.tensor([float(len(x))], dtype=torch.float64)))
        self.labels = labels.long()
        self.onehot = F.one_hot(self.labels, classes).T.to(dtype)
        widths = [x.shape[1], *self.opt.hidden, classes]
        self.layers = len(widths) - 1
        g = torch.Generator().manual_seed(self.opt.seed)  # the same weights on every rank
        self.W = [(torch.randn(n_out, n_in, generator=g, dtype=torch.float64) * self.opt.init_scale / math.sqrt(n_in)).to(dtype)
                  for n_in, n_out in zip(widths[:-1], widths[1:])]
        self.b = [torch.zeros(n_out, 1, dtype=dtype) for n_out in widths[1:]]
        self.a = [x.T.to(dtype).contiguous()]
        self.z: list[torch.Tensor] = []
        for l in range(self.layers):  # start every auxiliary variable on the network's own forward pass
            self.z.append(self.W[l] @ self.a[l] + self.b[l])
            if l < self.layers - 1:
                self.a.append(torch.relu(self.z[l]))
        self.u = torch.zeros_like(self.z[-1])
        self.theta = [1.0] * self.layers  # W's accepted curvatures, warm starts of the next backtracking
        self.tau = [1.0] * self.layers  # a[l]'s (index 0 unused: the data is fixed)
        self.iterations_done = 0

    # --- the coupling terms ----------------------------------------------------------------

    def kappa(self, l: int) -> float:
        return self.opt.rho if l == self.layers - 1 else self.opt.nu

    def shift(self, l: int) -> torch.Tensor | None:
        return self.u / self.opt.rho if l == self.layers - 1 else None

    # --- the updates -----------------------------------------------------------------------

    def _W(self, l: int) -> None:
        o = self.opt
        if o.solve == "exact":
            self.W[l] = sp.solve_W(self.b[l], self.z[l], self.a[l], self.shift(l), self.kappa(l), o.weight_decay, self.total)
            return
        start = max(self.theta[l] / o.backtrack_factor, 1e-8)
        self.W[l], self.theta[l] = sp.update_W(self.W[l], self.b[l], self.z[l], self.a[l], self.shift(l), self.kappa(l),
                                               o.weight_decay, start, o.backtrack_factor, self.total)

    def _b(self, l: int) -> None:
        self.b[l] = sp.update_b(self.z[l], self.W[l], self.a[l], self.shift(l), self.n_total, self.total)

    def _z(self, l: int) -> None:
        if l == self.layers - 1:
            self.z[l] = sp.update_z_out(self.z[l], self.W[l], self.a[l], self.b[l], self.u, self.labels, self.onehot,
                                        self.opt.rho, self.opt.zl_steps)
        else:
            self.z[l] = sp.update_z_hidden(self.W[l], self.a[l], self.b[l], self.a[l + 1])

    def _a(self, l: int) -> None:
        """a[l], the output of layer l-1 and the input of layer l (1 <= l <= L-1)."""
        o = self.opt
        if o.solve == "exact":
            self.a[l] = sp.solve_a(self.z[l - 1], self.W[l], self.b[l], self.z[l], self.shift(l), self.kappa(l), o.nu)
            return
        start = max(self.tau[l] / o.backtrack_factor, 1e-8)
        self.a[l], self.tau[l] = sp.update_a(self.a[l], self.z[l - 1], self.W[l], self.b[l], self.z[l], self.shift(l),
                                             self.kappa(l), o.nu, start, o.backtrack_factor, self.total)

    def updates(self) -> list[Update]:
        """One iteration's primal updates in order, as (variable, layer, apply): the backward sweep
        from the output layer to the first, then the forward sweep back up."""
        last = self.layers - 1
        step: dict[str, Callable[[int], None]] = {"W": self._W, "b": self._b, "z": self._z, "a": self._a}
        order = [("z", last), ("b", last), ("W", last)]
        for l in range(last - 1, -1, -1):
            order += [("a", l + 1), ("z", l), ("b", l), ("W", l)]
        for l in range(last):
            order += [("W", l), ("b", l), ("z", l), ("a", l + 1)]
        order += [("W", last), ("b", last), ("z", last)]
        return [(name, l, (lambda f=step[name], l=l: f(l))) for name, l in order]

    def dual_update(self) -> None:
        last = self.layers - 1
        self.u = self.u + self.opt.rho * (self.z[last] - self.W[last] @ self.a[last] - self.b[last])

    def iterate(self) -> None:
        """One dlADMM iteration: backward sweep, forward sweep, dual update."""
        for _, _, apply in self.updates():
            apply()
        self.dual_update()
        self.iterations_done += 1

    # --- what the run reports ----------------------------------------------------------------

    def measures(self) -> dict[str, float]:
        """Global augmented Lagrangian, output-constraint residual ||z_L - W_L a_{L-1} - b_L||,
        hidden-constraint residuals and training loss (cross-entropy of the network's own
        forward pass, per sample), from one reduction."""
        last, nu, rho = self.layers - 1, self.opt.nu, self.opt.rho
        e = self.z[last] - self.W[last] @ self.a[last] - self.b[last]
        hidden_sq = torch.zeros((), dtype=e.dtype)
        for l in range(last):
            r = self.z[l] - self.W[l] @ self.a[l] - self.b[l]
            d = self.a[l + 1] - torch.relu(self.z[l])
            hidden_sq = hidden_sq + (r * r).sum() + (d * d).sum()
        lagrangian = sp.cross_entropy_sum(self.z[last], self.labels) + 0.5 * nu * hidden_sq + (self.u * e).sum() \
            + 0.5 * rho * (e * e).sum()
        net_loss = sp.cross_entropy_sum(self.forward(self.a[0]), self.labels)
        lag, e_sq, h_sq, loss = self.total(torch.stack([lagrangian, (e * e).sum(), hidden_sq, net_loss]).double()).tolist()
        lag += 0.5 * self.opt.weight_decay * sum(float((W * W).sum()) for W in self.W)
        return {"lagrangian": lag, "primal_residual": math.sqrt(e_sq), "hidden_residual": math.sqrt(h_sq),
                "train_loss": loss / self.n_total}

    def forward(self, a0: torch.Tensor) -> torch.Tensor:
        """The trained network on column-major inputs: relu layers, then the logits."""
        a = a0
        for l in range(self.layers):
            z = self.W[l] @ a + self.b[l]
            a = torch.relu(z) if l < self.layers - 1 else z
        return a

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (samples x classes) of row-major inputs."""
        return self.forward(x.T.to(self.W[0].dtype)).T

    def to_module(self) -> torch.nn.Sequential:
        """The trained weights as an ordinary torch MLP (Linear, ReLU, ..., Linear)."""
        mods: list[torch.nn.Module] = []
        for l in range(self.layers):
            lin = torch.nn.Linear(self.W[l].shape[1], self.W[l].shape[0]).to(self.W[l].dtype)
            with torch.no_grad():
                lin.weight.copy_(self.W[l])
                lin.bias.copy_(self.b[l].squeeze(1))
            mods += [lin] + ([torch.nn.ReLU()] if l < self.layers - 1 else [])
        return torch.nn.Sequential(*mods)
