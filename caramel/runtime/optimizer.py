"""The user's optimizer, taught to defer: same object, same state, a subclass of its class.

`parallelize` swaps the optimizer's class for a subclass that routes `step()` through the
engine. The object keeps its identity, `param_groups`, `state`, `state_dict()`, LR schedulers
and `isinstance` checks; `synchronize()` applies every pending update.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from caramel.runtime.compression import STATE_KEY as COMPRESSION_STATE_KEY

# what the strategy's controller has learned (the balancers' windows and decisions, the plan in
# force once settled), as its `adaptive_state()` gives it; absent when there is none, and in
# checkpoints older than it
ADAPTIVE_STATE_KEY = "caramel_adaptive"

# Optimizers whose update of a parameter depends only on that parameter's own gradient and
# state, so that applying them bucket by bucket equals one step over all parameters.
PER_PARAMETER_OPTIMIZERS = (
    "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop",
    "Adafactor", "SparseAdam",
)


class CaramelOptimizerMixin:
    """Mixed in front of the user's optimizer class."""

    _caramel_engine: Any
    _caramel_base: type

    def step(self, closure=None):  # noqa: D401 - same contract as torch.optim.Optimizer.step
        """Like the wrapped optimizer's step; the update may be applied later (see `synchronize`)."""
        self._opt_called = True  # tells LR schedulers a step happened
        engine = self._caramel_engine
        if closure is not None:
            # A closure (LBFGS) runs forward and backward itself, possibly several times: apply
            # what is pending, and hand the optimizer averaged gradients after each evaluation.
            engine.synchronize()

            def reduced_closure():
                loss = closure()
                engine.gradients_to_params()
                return loss
            return self._caramel_base.step(self, reduced_closure)
        if engine.step():
            return None
        return self._caramel_base.step(self)

    def _caramel_inner_step(self) -> None:
        self._caramel_base.step(self)

    def synchronize(self) -> None:
        """Apply every pending update now (before evaluation, checkpointing, reading parameters)."""
        self._caramel_engine.synchronize()
        self._caramel_engine.write_trace()

    def state_dict(self):
        """The optimizer's state, the engine's compression state (error feedback) and the
        controller's adaptive state (balance windows and decisions) when it has any."""
        engine = self._caramel_engine
        engine.synchronize()
        state = self._caramel_base.state_dict(self)
        codec_state = engine.compressor.state_dict()
        if codec_state:
            state[COMPRESSION_STATE_KEY] = codec_state
        adaptive = getattr(engine.controller, "adaptive_state", None)
        learned = adaptive() if adaptive is not None else None
        if learned:
            state[ADAPTIVE_STATE_KEY] = learned
        return state

    def load_state_dict(self, state_dict):
        engine = self._caramel_engine
        engine.synchronize()
        state_dict = dict(state_dict)
        engine.compressor.load_state_dict(state_dict.pop(COMPRESSION_STATE_KEY, None) or {})
        adaptive = state_dict.pop(ADAPTIVE_STATE_KEY, None)
        out = self._caramel_base.load_state_dict(self, state_dict)
        if adaptive and engine.controller is not None and hasattr(engine.controller, "load_adaptive_state"):
            engine.controller.load_adaptive_state(adaptive)
        return out

    @property
    def engine(self):
        return self._caramel_engine


def wrap_optimizer(optimizer: torch.optim.Optimizer, engine: Any) -> torch.optim.Optimizer:
    """Swap `optimizer`'s class for a Caramel subclass bound to `engine` (idempotent per object)."""
    base = optimizer._caramel_base if isinstance(optimizer, CaramelOptimizerMixin) else type(optimizer)
    cls = type(f"Caramel{base.__name__}", (CaramelOptimizerMixin, base), {"_caramel_base": base})
    return rebind_class(optimizer, cls, _caramel_engine=engine)


def rebind_class(optimizer: torch.optim.Optimizer, cls: type, **attrs: Any) -> torch.optim.Optimizer:
    """Give `optimizer` the class `cls` (a strategy's mixin over its own class) and set `attrs`
    on it. An LR scheduler created before parallelize() patched `optimizer.step` on the instance
    to call the original class's step; it is re-pointed at `cls`'s, keeping the scheduler's marker."""
    patched = "step" in vars(optimizer)
    if patched:
        del optimizer.step
    optimizer.__class__ = cls
    for name, value in attrs.items():
        setattr(optimizer, name, value)
    if patched:
        @functools.wraps(cls.step)
        def step(*args, **kwargs):
            return cls.step(optimizer, *args, **kwargs)
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        optimizer.step = step
    return optimizer


def steps_per_parameter(optimizer: torch.optim.Optimizer) -> bool:
    """True when the optimizer can be applied bucket by bucket (see PER_PARAMETER_OPTIMIZERS)."""
    base = optimizer._caramel_base if isinstance(optimizer, CaramelOptimizerMixin) else type(optimizer)
    return any(c.__module__.startswith("torch.optim") and c.__name__ in PER_PARAMETER_OPTIMIZERS for c in base.__mro__)
