"""What `caramel.parallelize(..., "gossip")` hands back: the user's module behind a DDP-shaped
wrapper, and the user's optimizer whose `step()` mixes, updates (with the trackers in place of
the gradients under algorithm=tracking) and sends (`run.GossipRun` does the work)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.runtime.optimizer import rebind_class

if TYPE_CHECKING:
    from caramel.strategies.gossip.run import GossipRun


class GossipModel(nn.Module):
    """The user's module behind a DDP-shaped wrapper (`.module`, `no_sync()`)."""

    def __init__(self, module: nn.Module, run: GossipRun):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_run", run)
        self._in_no_sync = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._run.tracker is not None:  # as DDP: the forward decides whether its backward sends
            self._run.tracker.armed = not self._in_no_sync
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients never leave a worker under gossip: accumulating them needs nothing special,
        except with overlapped trackers (algorithm=tracking), which leave in backward: a
        backward whose forward ran in here sends none (each later backward would send them again)."""
        before, self._in_no_sync = self._in_no_sync, True
        try:
            yield
        finally:
            self._in_no_sync = before

    def synchronize(self) -> None:
        self._run.synchronize()


class GossipOptimizerMixin:
    """Mixed in front of the user's optimizer class: `step()` mixes, updates, and sends."""

    _gossip_run: GossipRun
    _gossip_base: type

    def step(self, closure=None):  # noqa: D401 - same contract as torch.optim.Optimizer.step
        run = self._gossip_run
        if closure is not None and run.tracker is not None:
            raise CaramelError("strategy 'gossip': algorithm=tracking steps with the trackers it mixed from this "
                               "step's gradients; a closure would compute new ones inside step(). Call "
                               "backward() before optimizer.step() without a closure")
        if closure is not None and run.options.mixes_at_update:
            # the mix lands before the base step() runs the closure, whose gradient would then be
            # taken at W x(k): combine-then-adapt with nothing overlapped, not this algorithm
            raise CaramelError(f"strategy 'gossip': algorithm={run.options.algorithm} takes the gradient at the "
                               "un-mixed parameters and mixes just before the update; a closure would compute "
                               "it inside step(), after the mix. Call backward() before optimizer.step() "
                               "without a closure")
        if closure is not None and run.moments is not None:
            # the estimate is set up from p.grad as it stands at step(); a closure's new gradient
            # would then be added to an exp_avg_sq set up for the old one (negative, NaN)
            raise CaramelError("strategy 'gossip': second_moment=debiased sets exp_avg_sq from the gradient as it "
                               "stands at step(); a closure would compute a new one inside step(). Call "
                               "backward() before optimizer.step() without a closure")
        self._opt_called = True  # tells LR schedulers a step happened
        waited = run.before_update()
        frozen = run.frozen()
        grads = [p.grad for p in frozen]
        for p in frozen:  # an optimizer skips a parameter without a gradient (no decay, no momentum)
            p.grad = None
        try:
            out = self._gossip_base.step(self, closure)
        finally:
            for p, g in zip(frozen, grads):
                p.grad = g
            if run.tracker is not None:
                run.tracker.swap_out()  # the user's gradients are their own again
        run.after_update(waited)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        # a backward not followed by step() (GradScaler's skipped step, a dropped batch) must not
        # count toward the next step's two halves (cross_term=halves)
        if self._gossip_run.moments is not None:
            self._gossip_run.moments.reset_passes()
        self._gossip_base.zero_grad(self, set_to_none)

    def synchronize(self) -> None:
        """Every pending mix applied (eval, checkpoint, exit); workers' parameters still differ."""
        self._gossip_run.synchronize()

    @property
    def gossip(self) -> GossipRun:
        return self._gossip_run


def wrap_optimizer(optimizer: torch.optim.Optimizer, run: GossipRun) -> torch.optim.Optimizer:
    base = type(optimizer)
    cls = type(f"Gossip{base.__name__}", (GossipOptimizerMixin, base), {"_gossip_base": base})
    return rebind_class(optimizer, cls, _gossip_run=run)
