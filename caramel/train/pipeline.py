"""`caramel train --strategy pipeline:...`: the training loop's side of `caramel.pipeline`.

The loop trains a workload's model; a pipeline cuts an `nn.Sequential`. `sequential_view` gives
each workload an `nn.Sequential` that computes the very same function with the very same
parameter tensors (its children are the model's own modules), so the pipeline trains the
model in place, and validation and checkpoints keep using the model with its own keys.

A step: every rank of a pipeline passes the same batch, the concatenation of the shards the
data sampler gives that pipeline's ranks, so the job trains the same samples per step as data
parallelism over the same workers. The loss comes back on every rank (`Pipeline.step`
broadcasts the last stage's), so rank 0 logs the right one although it holds the first stage.

Between steps a rank's copy of the other stages is stale; `synchronize` (eval, checkpoint, end)
gathers the whole model along the pipeline into it. The optimizer is the whole model's, but a
rank only steps its own stages' parameters (the others never get a gradient), so its state
holds only theirs: a checkpoint merges every rank's state, each parameter's from a rank that
owns it, into the whole model's optimizer state (the same as data parallelism's, so a run can
resume under another strategy), and a resumed rank keeps its own parameters' part. The cut
(`partition="auto"` is profiled) is saved too and reused on resume, so the resumed run is the
same computation, bit for bit.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from caramel.errors import CaramelError
from caramel.train.data import ShardedSampler


class _ReluPoolFlatten(nn.Module):
    """DigitsNet's parameter-free step between its convolutions and its linear layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(F.max_pool2d(F.relu(x), 2), 1)


class _Frozen(nn.Module):
    """DdrlNet's fitted extractor, run without gradients; held outside the module tree, as in
    DdrlNet (it never changes and must not fill state dicts)."""

    def __init__(self, extractor: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "extractor", extractor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extractor.feat_mean.device != x.device:
            self.extractor.to(x.device)
        with torch.no_grad():
            return self.extractor(x)


def sequential_view(name: str, model: nn.Module) -> nn.Sequential:
    """An `nn.Sequential` over `model`'s own modules that computes what `model` does."""
    from caramel.ddrl.model import DdrlNet
    from caramel.train.workloads import DigitsNet

    if isinstance(model, DigitsNet):
        layers: list[tuple[str, nn.Module]] = [("conv1", model.conv1), ("relu1", nn.ReLU()), ("conv2", model.conv2),
                                               ("pool", _ReluPoolFlatten())]
        layers += [(f"hidden{i}", nn.Sequential(lin, nn.ReLU(), model.drop)) for i, lin in enumerate(model.hidden)]
        return nn.Sequential(OrderedDict(layers + [("head", model.head)]))
    if isinstance(model, DdrlNet):
        head = [(f"head{i}", m) for i, m in enumerate(model.head)]
        return nn.Sequential(OrderedDict([("features", _Frozen(model.extractor)), *head]))
    raise CaramelError(f"strategy pipeline: workload {name} has no layer sequence to cut into stages "
                       f"(char_gpt ties its input embedding to its output layer, which would sit on the first and "
                       f"the last stage); use --workload digits or ddrl, or another strategy")


class PipelineParallel:
    """The loop's engine for a pipeline: the same calls as `Parallel`, over `caramel.pipeline`."""

    kind = "pipeline"

    def __init__(self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, options: Any, strategy: str,
                 sampler: ShardedSampler, start: int, batch: Callable[[torch.Tensor], tuple], loss_fn: Callable,
                 saved: dict[str, Any] | None = None, trace_path: str | None = None) -> None:
        import caramel

        self.strategy, self.model, self.optimizer, self.options = strategy, model, optimizer, options
        self.trace_path, self.first_step, self.steps_done, self.bubble = trace_path, start, 0, {}
        self.view = sequential_view(name, model)
        if saved is not None:  # the resumed run cuts where the first one did
            options = dataclasses.replace(options, partition="+".join(str(b) for b in saved["boundaries"]) or "auto",
                                          microbatches=saved["microbatches"])
        self.pipe = caramel.pipeline(self.view, optimizer, options=options)
        lay = self.pipe.layout
        self.samplers = [dataclasses.replace(sampler, rank=r) for r in lay.pipeline_ranks]
        self.pipe.prepare(*batch(self.batch_indices(sampler, start)), loss_fn)
        own = {id(p) for m in self.pipe.stage_modules for p in m.parameters()}
        # a stage is an nn.Sequential of the view's own children under their names: same keys
        self.own_keys = {k for m in self.pipe.stage_modules for k in m.state_dict()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.own_indices = [i for i, p in enumerate(params) if id(p) in own]

    # --- a step ---------------------------------------------------------------------------

    def batch_indices(self, sampler: ShardedSampler, step: int) -> torch.Tensor:
        """This pipeline's batch: the shards of its ranks, in position order."""
        return torch.cat([s.indices(step) for s in self.samplers])

    def train_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable, clip_grad_norm: float) -> torch.Tensor:
        """Microbatches through the stages, then the update (inside `Pipeline.step`)."""
        self.steps_done += 1
        return self.pipe.step(x, y, loss_fn)

    # --- sync points --------------------------------------------------------------------------

    @property
    def module(self) -> nn.Module:
        return self.model

    def synchronize(self) -> None:
        """Bring every rank's copy of the other stages up to date, measure the bubble so far and
        write this rank's timeline (all ranks call it)."""
        self.bubble = self.pipe.bubble_stats()
        self._write_trace()
        whole = self.pipe.state_dict()
        mine = self.view.state_dict()
        with torch.no_grad():
            for k, v in whole.items():
                if k not in self.own_keys:
                    mine[k].copy_(v)

    def eval_module(self) -> nn.Module:
        return self.model

    def optimizer_state(self) -> dict[str, Any]:
        """The whole model's optimizer state, each parameter's taken from a rank that owns it
        (all ranks call it; every rank gets it)."""
        sd = self.optimizer.state_dict()
        part = {i: sd["state"][i] for i in self.own_indices if i in sd["state"]}
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, part)
        state: dict[int, Any] = {}
        for p in parts:
            for i, s in p.items():
                state.setdefault(i, s)
        return {"state": dict(sorted(state.items())), "param_groups": sd["param_groups"]}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Load the whole model's optimizer state, keeping only this rank's parameters' part."""
        own = set(self.own_indices)
        self.optimizer.load_state_dict({"state": {i: s for i, s in state["state"].items() if i in own},
                                        "param_groups": state["param_groups"]})

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"pipeline": {"boundaries": list(self.pipe.boundaries or []),  # layer indices or module names
                             "microbatches": self.pipe.options.microbatches}}

    def worker_states(self) -> None:
        return None

    def load_worker_state(self, state: dict[str, Any], rank: int) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        """Options in force and the bubble measured at the last `synchronize` (no collective)."""
        o = self.pipe.options
        return {"planner": f"pipeline:{o.schedule}", "overlap": "n/a", "boundaries": self.pipe.boundaries,
                "microbatches": o.microbatches, **self.bubble}

    def _write_trace(self) -> None:
        """Every timed stage action of the steps kept, on this rank's compute lane (Perfetto-ready
        after `caramel trace`), the bubble in its meta: trace.rank<r>.json beside trace.json."""
        if not self.trace_path or self.pipe.timer is None:
            return
        from caramel.trace.events import Trace

        rank, world = dist.get_rank(), dist.get_world_size()
        path = Path(self.trace_path)
        if world > 1:
            path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
        first = self.first_step + self.steps_done - len(self.pipe.timer.steps)
        Trace("measured", world, self.pipe.timer.events(rank, first),
              {"strategy": self.strategy, **self.bubble}).save(path)

