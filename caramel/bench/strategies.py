"""Strategies the harness compares: one registry, `STRATEGY_BUILDERS`, kind -> builder.

A builder takes a fresh model and optimizer (identical on every rank) and returns a `Runner`
whose timed `step()` is the user's ordinary training step on the wrapped model. `ddp` is the
real `torch.nn.parallel.DistributedDataParallel` with default settings (plus any option the
strategy names); `caramel` is `caramel.parallelize` with the strategy's planner and overlap.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from caramel.bench.baselines import Runner, plain_step, sync_device
from caramel.bench.matrix import Strategy


class StrategyUnavailable(Exception):
    """This strategy cannot run here (e.g. the engine is not installed); the bench reports why and goes on."""


@dataclass
class StrategyContext:
    """What every builder gets besides the model: where it runs and what to record."""

    device: torch.device
    rank: int
    world_size: int
    process_group: Any = None
    trace_dir: str | None = None
    """when set, caramel strategies write their timeline here (one file per strategy and rank)"""


class TrainRunner(Runner):
    """A wrapped model + optimizer stepping on one fixed batch."""

    def __init__(self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, inputs, targets,
                 loss_fn: Callable, device: torch.device, finish: Callable[[], None] | None = None,
                 stats: Callable[[], dict[str, Any]] | None = None, settled: Callable[[], bool] | None = None):
        self.name = name
        self.model, self.optimizer = model, optimizer
        self.inputs, self.targets, self.loss_fn = inputs, targets, loss_fn
        self.device = device
        self._finish = finish
        self._stats = stats
        self._settled = settled

    def step(self) -> None:
        plain_step(self.model, self.optimizer, self.inputs, self.targets, self.loss_fn)
        sync_device(self.device)

    def finish(self) -> None:
        if self._finish is not None:
            self._finish()
        sync_device(self.device)

    def stats(self) -> dict[str, Any]:
        return self._stats() if self._stats is not None else {}

    def settled(self) -> bool:
        return self._settled() if self._settled is not None else True


Builder = Callable[[Strategy, nn.Module, torch.optim.Optimizer, Any, Any, Callable, StrategyContext], Runner]
STRATEGY_BUILDERS: dict[str, Builder] = {}


def register_strategy(kind: str):
    def deco(fn: Builder) -> Builder:
        assert kind not in STRATEGY_BUILDERS, f"strategy {kind} registered twice"
        STRATEGY_BUILDERS[kind] = fn
        return fn
    return deco


@register_strategy("ddp")
def build_ddp(strategy: Strategy, model, optimizer, inputs, targets, loss_fn, ctx: StrategyContext) -> Runner:
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs = strategy.option_dict()
    group, prio = _ddp_group(kwargs.pop("comm_priority", "normal"), ctx)
    if ctx.device.type == "cuda":
        kwargs.update(device_ids=[ctx.device.index], output_device=ctx.device.index)
    wrapped = DDP(model, process_group=group, **kwargs)
    # DDP's optimizer holds the same parameters (DDP does not copy them), so it needs no rewrap.
    return TrainRunner(strategy.name, wrapped, optimizer, inputs, targets, loss_fn, ctx.device,
                       stats=(lambda: {"comm_priority": prio.to_dict()}) if prio is not None else None)


def baseline_group(ctx: StrategyContext):
    """The group the comm-only and concurrent baselines run on, and its priority: on CPU, a gloo
    group of their own whose threads get the priority the engine gives its own by default
    (`comm_priority="auto"`), so that the baselines measure communication as the engine's runs;
    elsewhere (or alone) the job's own group."""
    if ctx.device.type != "cpu" or ctx.world_size == 1:
        return ctx.process_group, None
    return _ddp_group("auto", ctx)


def _ddp_group(mode: str, ctx: StrategyContext):
    """The process group DDP runs on: the job's own for `comm_priority="normal"` (DDP as users run
    it); else a new gloo group over the same ranks whose threads get the priority the engine gives
    its own (`caramel.runtime.comm_priority`), so that a table can tell the engine's schedule
    from the threads' priority."""
    from caramel.runtime.comm_priority import CommPriority

    if mode == "normal" or ctx.world_size == 1:
        return ctx.process_group, None
    if ctx.device.type != "cpu":
        raise StrategyUnavailable(f"comm_priority={mode} applies to gloo's threads (CPU training); this job runs on {ctx.device}")
    import torch.distributed as dist

    prio = CommPriority.resolve(mode)
    ranks = dist.get_process_group_ranks(ctx.process_group or dist.group.WORLD)
    # every rank makes the group, whatever its own privilege says (new_group waits for all of
    # them); a rank refused real-time priority reports it afterwards, and the harness then skips
    # the strategy on every rank
    group = prio.start(lambda: dist.new_group(ranks, backend="gloo"))
    if mode == "realtime" and prio.reason is not None:
        raise StrategyUnavailable(f"comm_priority=realtime: {prio.reason}")
    return group, prio


def caramel_api():
    """The `caramel` package if its engine (`parallelize`) is installed, else StrategyUnavailable."""
    try:
        module = importlib.import_module("caramel")
    except ImportError as e:  # pragma: no cover - we are inside caramel
        raise StrategyUnavailable(f"cannot import caramel: {e}") from None
    if not hasattr(module, "parallelize"):
        raise StrategyUnavailable("caramel.parallelize is not available in this installation (the runtime engine is missing)")
    return module


def trace_file_stem(strategy_name: str) -> str:
    """The file name (without `.json`) a strategy's timeline gets: its name with only safe characters."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in strategy_name)


def _trace_path(ctx: StrategyContext, strategy: Strategy) -> str | None:
    if not ctx.trace_dir:
        return None
    # The engine adds `.rank{r}.json` when world > 1.
    return str(Path(ctx.trace_dir) / f"{trace_file_stem(strategy.name)}.json")


@register_strategy("caramel")
def build_caramel(strategy: Strategy, model, optimizer, inputs, targets, loss_fn, ctx: StrategyContext) -> Runner:
    api = caramel_api()
    options = strategy.option_dict()
    trace = _trace_path(ctx, strategy)
    wrapped, opt = api.parallelize(model, optimizer, process_group=ctx.process_group, trace=trace, **options)

    def stats() -> dict[str, Any]:
        engine = getattr(opt, "engine", None)
        if engine is None:
            return {}
        if callable(getattr(engine, "stats_dict", None)):
            return dict(engine.stats_dict())
        s = engine.stats
        s = s() if callable(s) else s
        return dict(s) if isinstance(s, dict) else dict(vars(s))

    def settled() -> bool:
        from caramel.runtime import schedule_settled
        return schedule_settled(opt)

    return TrainRunner(strategy.name, wrapped, opt, inputs, targets, loss_fn, ctx.device,
                       finish=opt.synchronize, stats=stats, settled=settled)


def build_strategy(strategy: Strategy, model, optimizer, inputs, targets, loss_fn, ctx: StrategyContext) -> Runner:
    """The runner for `strategy`; StrategyUnavailable when it cannot run in this installation."""
    assert strategy.kind in STRATEGY_BUILDERS, f"no builder for strategy kind {strategy.kind}"
    return STRATEGY_BUILDERS[strategy.kind](strategy, model, optimizer, inputs, targets, loss_fn, ctx)
