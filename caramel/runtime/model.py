"""`CaramelModel`: the user's module behind a DDP-shaped wrapper.

Like DDP: `.module` is the user's model, `no_sync()` skips gradient reduction (gradient
accumulation), and `state_dict()` keys carry the `module.` prefix. Unlike DDP, parameters may
hold a pending update between `optimizer.step()` and the next forward; everything that reads
parameters as a whole (`state_dict()`, switching to `eval()`) applies pending updates first.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch.nn as nn

from caramel.errors import CaramelError
from caramel.runtime.engine import RELEASED, Engine


class CaramelModel(nn.Module):
    def __init__(self, module: nn.Module, engine: Engine):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_engine", engine)  # not a submodule: keep it out of state_dict/modules()

    @property
    def engine(self) -> Engine:
        return self._engine

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        engine = self._engine
        if engine.comm is None:
            raise CaramelError(RELEASED)
        if engine.delegating:
            # DDP prepares its reducer for this backward only when gradients are to be synced
            engine.ddp.require_backward_grad_sync = engine.require_sync
            try:
                return engine.ddp(*args, **kwargs)
            except RuntimeError as e:
                if engine.ddp.find_unused_parameters or "finished reduction" not in str(e):
                    raise
                raise RuntimeError(
                    "caramel: torch DDP, which runs DDP's schedule for the engine (overlap trial), did not finish "
                    "reducing the last step: a parameter got no gradient, or a forward ran without its backward. "
                    "parallelize(find_unused_parameters=False) promised every parameter a gradient in every step; "
                    "if some parameter can go without one, use find_unused_parameters=True (the default). "
                    f"torch DDP said: {e}") from e
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, with no communication."""
        with self._engine.no_sync():
            yield

    def synchronize(self) -> None:
        """Apply every pending update (same as `optimizer.synchronize()`)."""
        self._engine.synchronize()

    def state_dict(self, *args: Any, **kwargs: Any):
        self._engine.synchronize()
        return super().state_dict(*args, **kwargs)

    def train(self, mode: bool = True):
        if not mode:
            self._engine.synchronize()
        return super().train(mode)
