"""The runtime half of branch order: the model's forward, swapped for one that runs its
independent branches in the plan's order (`Plan.module_order`).

The reordered forward is a `torch.fx.GraphModule` over the model's own module objects
(`caramel.profile.branches`), set as the model instance's `forward`: `model(x)` still runs the
model's hooks, every module the engine hooks is still called (its pre-hook applies its updates
before its first use), and the parameters, buffers and `state_dict` are the model's own. FX
fixes each module's `training` flag at trace time, so in any other mode (`model.eval()`) the
model's own forward runs. A plan without a module order, or `restore()`, puts it back for good.
"""
from __future__ import annotations

from typing import Any

import torch.nn as nn

from caramel.profile.branches import BranchGraph, find_branches


class BranchForward:
    """Traces the model once, when first asked, and installs the forward a plan's order asks for."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._graph: BranchGraph | None = None
        self._installed: Any = None  # the forward we set on the model, or None
        self._traced_flags: list[bool] = []  # every module's `training` when traced
        self.failed: str | None = None  # why the last order asked for could not be built
        self.order: dict[int, tuple[int, ...]] = {}  # per block (of the traced graph): the branch order in force

    def graph(self) -> BranchGraph:
        if self._graph is None:
            self._traced_flags = [m.training for m in self.model.modules()]
            self._graph = find_branches(self.model)
        return self._graph

    def describe(self) -> dict[str, Any]:
        """The profile's `meta` entries for the planner: the blocks, or why there are none."""
        g = self.graph()
        return {"branches": [b.to_dict() for b in g.blocks], "branches_reason": g.reason}

    def apply(self, module_order: list[str] | None) -> None:
        """Run each reorderable block's branches in the order their modules first appear in
        `module_order` (branches it does not name first, in the model's order); None: the model's own forward."""
        perms = {} if module_order is None else self.perms(module_order)
        if perms == self.order:
            return
        self.restore()
        if perms:
            try:
                gm = self.graph().reordered(perms)
            except (ValueError, RuntimeError) as e:  # the order is a speed choice: never fail a step over it
                self.failed = f"{type(e).__name__}: {e}"
                return
            own = type(self.model).forward.__get__(self.model)
            modules = list(self.model.modules())
            traced = self._traced_flags

            def forward(*args, **kwargs):
                # FX bakes `self.training` in as it was when traced (F.dropout(x, training=self.training),
                # `if self.training:`): in another mode the model's own forward runs
                if [m.training for m in modules] != traced:
                    return own(*args, **kwargs)
                return gm(*args, **kwargs)

            self._installed = forward
            # an instance attribute: nn.Module.__call__ runs it with the model's own hooks around it
            object.__setattr__(self.model, "forward", forward)
            self.order = perms

    def perms(self, module_order: list[str]) -> dict[int, tuple[int, ...]]:
        """Per reorderable block, the branch permutation `module_order` implies (identity ones left out)."""
        g = self.graph()
        pos = {n: k for k, n in enumerate(module_order)}
        out = {}
        for i in g.reorderable():
            branches = g.blocks[i].branches

            def key(j: int) -> tuple[int, int]:
                return (min((pos[m] for m in branches[j] if m in pos), default=-1), j)
            perm = tuple(sorted(range(len(branches)), key=key))
            if perm != tuple(range(len(branches))):
                out[i] = perm
        return out

    def restore(self) -> None:
        """The model's own forward again."""
        if self._installed is not None and self.model.__dict__.get("forward") is self._installed:
            del self.model.__dict__["forward"]
        self._installed = None
        self.order = {}
