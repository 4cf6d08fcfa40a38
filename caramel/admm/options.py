"""dlADMM's knobs: the network's shape, the penalties, the sweeps and the inner solver.

    AdmmOptions(hidden=(128,), rho=1.0, nu=1.0, iterations=60)
    build_options(AdmmOptions, {"rho": 2.0}, "admm")   # the text form, as experiments parse it

`rho` weighs the output layer's constraint z_L = W_L a_{L-1} + b_L, which is enforced by a dual
variable; `nu` weighs the hidden layers' relaxed constraints z_l = W_l a_{l-1} + b_l and
a_l = relu(z_l), which are quadratic penalties (dlADMM's formulation). Both are per sample: the
objective sums over samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from caramel.errors import CaramelError

DTYPES = ("float64", "float32")
SOLVES = ("backtrack", "exact")


@dataclass(frozen=True)
class AdmmOptions:
    """`hidden`: widths of the hidden ReLU layers (the input and output widths come from the
    data). `rho`: penalty (and dual step) of the output constraint. `nu`: penalty of the hidden
    constraints. `weight_decay`: (weight_decay / 2) ||W_l||^2 on every layer's weights.
    `iterations`: backward-then-forward sweeps, each followed by one dual update. `zl_steps`:
    gradient steps of the output subproblem (cross-entropy plus quadratic; warm-started).
    `backtrack_factor`: how much the quadratic approximation's curvature grows per rejected
    trial. `init_scale`: std of the initial weights times sqrt(fan_in). `seed`: weight init.
    `solve`: "backtrack" (dlADMM: one step on a quadratic approximation of the W and a
    subproblems, curvature grown until it bounds the objective) or "exact" (solve those two
    quadratics outright; cubic in the layer width instead of quadratic).
    `dtype`: float64 (results identical across world sizes to rounding) or float32 (faster)."""

    hidden: tuple[int, ...] | int | str = (128,)  # a str is widths joined by "x" (128x64), as a spec writes it
    rho: float = 1.0
    nu: float = 1.0
    weight_decay: float = 0.0
    iterations: int = 60
    zl_steps: int = 10
    backtrack_factor: float = 2.0
    init_scale: float = 1.0
    seed: int = 0
    solve: str = field(default="backtrack", metadata={"choices": SOLVES})
    dtype: str = field(default="float64", metadata={"choices": DTYPES})

    def __post_init__(self) -> None:
        if isinstance(self.hidden, int):
            object.__setattr__(self, "hidden", (self.hidden,))
        if isinstance(self.hidden, str):  # "128x64" from a spec string
            try:
                object.__setattr__(self, "hidden", tuple(int(w) for w in self.hidden.split("x") if w))
            except ValueError:
                raise CaramelError(f"hidden must be widths joined by 'x' (e.g. 128x64), got {self.hidden!r}") from None
        if not self.hidden or any(not isinstance(w, int) or w < 1 for w in self.hidden):
            raise CaramelError(f"hidden must be one or more positive layer widths, got {self.hidden!r}")
        for name in ("rho", "nu", "init_scale"):
            if not getattr(self, name) > 0:
                raise CaramelError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.weight_decay < 0:
            raise CaramelError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.iterations < 1 or self.zl_steps < 1:
            raise CaramelError(f"iterations and zl_steps must be >= 1, got {self.iterations} and {self.zl_steps}")
        if not self.backtrack_factor > 1:
            raise CaramelError(f"backtrack_factor must be > 1 (the curvature must grow), got {self.backtrack_factor!r}")
        if self.solve not in SOLVES:
            raise CaramelError(f"solve must be one of {', '.join(SOLVES)}, got {self.solve!r}")
        if self.dtype not in DTYPES:
            raise CaramelError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
