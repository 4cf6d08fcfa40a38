"""`caramel.parallelize(model, optimizer, strategy="caramel", **options)`: one entry, any strategy.

The keywords are what a DDP user sets (process group, buffers, unused parameters, timeout) and
the data Caramel can take (a plan, a profile, a cluster spec, a trace path); every other
keyword is a knob of the chosen strategy, checked against its options dataclass, so a
misspelled one is an error naming the nearest valid option, never silently ignored.
"""
from __future__ import annotations

import atexit
import os
from typing import Any

import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.strategies import STRATEGIES
from caramel.strategies.session import Session

# The process's default session (`caramel.strategies.session`): every parallelize call without
# its own session registers its engines and draws its group names here, and the exit handler
# releases them before interpreter teardown.
DEFAULT_SESSION = Session()
atexit.register(DEFAULT_SESSION.shutdown)


def shutdown() -> None:
    """Release the private communication groups of every model parallelized in this process.

    Runs by itself at interpreter exit (before module teardown, so gloo's threads are joined
    while the interpreter is intact); call it earlier to free them, e.g. before
    `dist.destroy_process_group()`. Pending updates are applied first. A model used after
    shutdown raises an error naming it. Idempotent.
    """
    DEFAULT_SESSION.shutdown()


def parallelize(model: nn.Module, optimizer: torch.optim.Optimizer, strategy: str = "caramel", *,
                options: Any = None, process_group: Any = None, broadcast_buffers: bool | str = True,
                find_unused_parameters: bool | None = None, timeout_s: float | None = None,
                plan: Any = None, profile: Any = None, cluster: Any = None,
                trace: str | os.PathLike | None = None, session: Session | None = None,
                **option_values: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Wrap `model` and `optimizer` for training across processes with `strategy`.

    `strategy` is a registered name, optionally with options (`"caramel:overlap=forward"`);
    `options` a ready options object of that strategy (then no further option keywords).
    `session` owns the engines and their group names (`caramel.strategies.session`); the
    default is the process's, released by `shutdown()` and at exit.
    Returns `(model, optimizer)`; `optimizer.synchronize()` applies any pending update.
    """
    if not isinstance(strategy, str):
        raise CaramelError(f"strategy must be a name such as 'caramel' or 'ddp:bucket_cap_mb=50', got {strategy!r}")
    if options is not None:
        info = STRATEGIES.get(strategy)
        if not isinstance(options, info.options):
            raise CaramelError(f"options must be a {info.options.__name__} for strategy {info.name!r}, "
                               f"got {type(options).__name__}")
        if option_values or ":" in strategy:
            raise CaramelError("pass the strategy's options either as an options object or as keywords, not both")
        spec_options = options
    else:
        spec = STRATEGIES.spec(strategy, option_values)
        info, spec_options = spec.info, spec.options
    return info.runtime()(model, optimizer, spec_options, process_group=process_group,
                          broadcast_buffers=broadcast_buffers, find_unused_parameters=find_unused_parameters,
                          timeout_s=timeout_s, plan=plan, profile=profile, cluster=cluster, trace=trace,
                          session=session or DEFAULT_SESSION)
