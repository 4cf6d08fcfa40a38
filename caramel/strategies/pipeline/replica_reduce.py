"""Hybrid pipelines: how a stage's replicas average their gradients (DDP's stage fix, Caramel's engine).

`replica_reduce="caramel"`: each stage module is handed to the caramel strategy on its replica
group (`parallelize_caramel`), with a plan made from a profile of that stage, so the replicas
reduce in the planner's buckets and order, and each update is applied lazily, per bucket, just
before the next step's first microbatch forward uses it (`overlap="forward"`).

What torch's pipelining stage does for DDP is done here for the engine:

- *One reduction per step.* `CaramelStage` runs every microbatch's backward but the last under
  the engine's `no_sync()`, so gradients accumulate in `p.grad`; the last backward's gradient
  hooks copy the accumulated sum into the buckets and the all-reduces start while that backward
  still runs.
- *Gradient scaling folded into the reduction.* torch's schedule divides `p.grad` by the
  microbatch count after the last backward, too late for gradients already copied into the
  engine's buckets: the schedule runs with `scale_grads=False` and each rank's bucket weight is
  `1 / (replicas x microbatches)`, so the sum over replicas is the whole batch's mean gradient.
- *Pending updates.* `optimizer.step()` only records the step; the pipeline flushes what is
  pending (`flush`) before it reads or loads parameters (state dicts, checkpoints); the
  optimizer's own `state_dict()` flushes too (`caramel.runtime.optimizer`).
- *Buffers.* The replica group's first rank's buffers reach the others once per step, after the
  schedule (`broadcast_buffers`), not at each forward as the engine would.

The plan: every rank profiles a copy of its stage on one microbatch (its input computed by the
stages before it, its loss the real one on the last stage and a stand-in of the same cost shape
elsewhere); the replica group's first rank plans from its profile and sends the plan to the
others. No online profiling, overlap trial, periodic check or deferred weight gradients: those
watch one forward and one backward per step, and a pipeline step runs several of each.

`replica_reduce="ddp"` runs `DDPStage`: torch's stage over DDP, its first-step shape inference
kept out of DDP's reducer.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage

from caramel.distributed import broadcast_coalesced
from caramel.errors import CaramelError

PROFILE_STEPS = 3


class KeepBuffersStage(PipelineStage):
    """torch's pipeline stage whose first-step shape inference leaves the module's buffers as
    they were. torch runs that inference as a real forward (and backward) of the stage's module:
    on the first stage with the first microbatch, on the others with uninitialized tensors of the
    received shapes (`torch.empty`), so a BatchNorm there folds garbage, often inf or NaN, into
    its running statistics for good, and every stage counts one batch too many. The buffers are
    saved before the inference's forward and put back once torch has finished with it (its
    backward may still read them)."""

    _saved_buffers: list[torch.Tensor] | None = None

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        if self._saved_buffers is None:
            self._saved_buffers = [b.detach().clone() for b in self.submod.buffers()]
        return super()._forward_metadata_inference(*args, **kwargs)

    def _post_metadata_inference_cleanup(self) -> None:
        super()._post_metadata_inference_cleanup()
        if self._saved_buffers is not None:
            with torch.no_grad():
                for b, saved in zip(self.submod.buffers(), self._saved_buffers):
                    b.copy_(saved)
            self._saved_buffers = None


class CaramelStage(KeepBuffersStage):
    """torch's pipeline stage whose module's gradients the Caramel engine `engine` reduces: all
    backwards but the step's last accumulate locally (torch does the same with DDP's `no_sync`)."""

    def __init__(self, submodule: nn.Module, stage_index: int, num_stages: int, device: torch.device,
                 engine: Any, group: Any = None) -> None:
        super().__init__(submodule, stage_index, num_stages, device, group=group)
        self.engine = engine

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        if last_backward:
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward=True)
        with self.engine.no_sync():
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward=False)


class DDPStage(KeepBuffersStage):
    """torch's pipeline stage over a DDP-wrapped module, its shape-inference forward run under
    `no_sync()`. torch runs that forward through DDP outside `no_sync()` at the first step, so
    DDP's reducer expects a backward that never comes (the inference differentiates the inputs
    only); the next no-sync microbatch backward then feeds its bucket rebuild, which counts every
    parameter twice and stops the second step (`rebuilt parameter indices size is not same as
    original model parameters size`), seen with 2 microbatches."""

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        with self.submod.no_sync():
            return super()._forward_metadata_inference(*args, **kwargs)


def stage_input(stages: list[nn.Module], index: int, sample: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The input of stage `index` on `sample`: the stages before it run on copies, without
    gradients (the real modules stay untouched)."""
    args: tuple[torch.Tensor, ...] = (sample,)
    with torch.no_grad():
        for m in stages[:index]:
            out = copy.deepcopy(m)(*args)
            args = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return args


def stage_plan_source(module: nn.Module, args: tuple[torch.Tensor, ...], targets: torch.Tensor,
                      loss_fn: Callable | None, replicas: int) -> dict[str, Any]:
    """What the engine plans from, as `parallelize` keywords: a profile of a copy of `module` on
    one microbatch. A stage other than the last has no loss of its own: the stand-in
    `mean(output^2)` gives its backward the same work (a backward's cost does not depend on the
    values of the gradient it receives). A stage that takes several tensors (a traced model cut
    where several activations cross) cannot be profiled with one input: it gets DDP's buckets
    in reverse registration order (the "fifo" planner) instead."""
    from caramel.profile.profiler import profile_model, unique_params
    from caramel.strategies.caramel.profiling import registration_profile
    from caramel.strategies.planners import make_plan

    if len(args) != 1:
        names, params = unique_params(module)
        return {"plan": make_plan("fifo", registration_profile(names, params), world_size=replicas)}

    def stand_in(out: Any, _targets: torch.Tensor) -> torch.Tensor:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return sum(o.float().pow(2).mean() for o in outs if torch.is_tensor(o) and o.is_floating_point())

    return {"profile": profile_model(copy.deepcopy(module), args[0], targets,
                                     loss_fn if loss_fn is not None else stand_in, steps=PROFILE_STEPS,
                                     name="pipeline-stage", split_tied=False)}


def broadcast_buffers(module: nn.Module, group: Any) -> None:
    """The replica group's first rank's buffers (BatchNorm statistics) on every replica, once per
    step after the schedule, as DDP leaves them (`broadcast_coalesced`). The engine's own buffer
    broadcast is off: it writes the buffers as each forward starts, and the microbatches' earlier
    forwards have saved them for their backwards still to come."""
    broadcast_coalesced(list(module.buffers()), dist.get_global_rank(group, 0), group)


def caramel_replicas(module: nn.Module, optimizer: torch.optim.Optimizer, replica_group: Any, replicas: int,
                     microbatches: int, source: dict[str, Any]) -> Any:
    """Hand `module` (one stage) and the optimizer that steps it to Caramel's engine on
    `replica_group`; returns the engine. Each rank's gradients weigh 1 / (replicas x
    microbatches) in the sum (module docstring)."""
    from caramel.strategies.api import DEFAULT_SESSION
    from caramel.strategies.caramel.parallelize import parallelize_caramel
    from caramel.strategies.pipeline.replica_options import replica_engine_options

    # no split layers (deferred or early weight gradients): a stage runs several microbatches'
    # forwards before their backwards, and the engine's applied updates would change the weights
    # the split layers saved for backward; the simulator plans with the same options
    # (replica_options.py; a test pins them)
    options = replica_engine_options()
    parallelize_caramel(module, optimizer, options, process_group=replica_group, session=DEFAULT_SESSION,
                        broadcast_buffers=False, optimizer_holds_more=True, **source)
    engine = optimizer._caramel_engine
    engine.set_grad_scale(1.0 / (replicas * microbatches))
    return engine


def watch_engine_reduces(timer: Any, engine: Any) -> None:
    """Have the stage timer record `engine`'s collectives (`StageTimer.watch_reduces`, with
    `reduce_plan`). The timer empties the engine's log of collectives every step, so an engine
    that reads that log itself (online profiling, an overlap trial, periodic checks, which may
    also replan and leave the recorded plan stale) is refused rather than silently starved."""
    controller = engine.controller
    checks = getattr(controller, "checks", None)
    readers = [what for what, on in (("online profiling", getattr(controller, "profiler", None) is not None),
                                     ("an overlap trial", getattr(controller, "trial", None) is not None),
                                     ("periodic checks", bool(checks is not None and checks.check_every)))
               if on]
    if readers:
        raise CaramelError(f"pipeline: the stage timer takes Caramel's engine's log of collectives every step, "
                           f"which its {' and '.join(readers)} also read; build the replicas' engine as "
                           f"`caramel_replicas` does (check_every=0, overlap='forward', a plan or profile given)")
    timer.watch_reduces(engine._dispatcher, reduce_plan(engine))


def reduce_plan(engine: Any) -> list[tuple[int, int, int]]:
    """The engine's collectives of one step in issue order: (bucket, chunk, bytes on the wire
    uncompressed), from its dispatcher's order (`caramel.runtime.dispatch`), for the trace."""
    buckets = engine.buckets
    return [(b, c, buckets[b].chunks[c].numel() * buckets[b].flat.element_size())
            for b, c in engine._dispatcher.order]
