"""`caramel.pipeline(...)`: a model cut into stages across workers, trained one step at a time.

    pipe = caramel.pipeline(model, optimizer, stages=2, microbatches=4, schedule="1f1b")
    loss = pipe.step(inputs, targets, loss_fn)   # every rank calls it with the same batch
    state = pipe.state_dict()                    # the whole model's, on every rank

Synchronous schedules ("gpipe", "1f1b", "interleaved") are torch.distributed.pipelining's own:
its `PipelineStage` and schedules run the microbatches, with gradients averaged over them (so a
step equals one step on the whole batch). What torch lacks is added here: the partition (explicit
or PipeDream's planner on a profile), the hybrid layout (stage replicas in a group of their own,
averaging gradients once per step: torch's stage already drives a DDP-wrapped module; Caramel's
engine is driven by `replica_reduce.py`), one optimizer step per step, the loss on every rank
and a whole-model state dict. "pipedream" runs `PipeDreamStage` (asynchronous, weight stashing).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from caramel.errors import CaramelError
from caramel.strategies.pipeline.layout import Layout, make_layout, split_sequential
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.pipedream import PipeDreamStage
from caramel.strategies.pipeline.replica_reduce import (DDPStage, KeepBuffersStage, broadcast_buffers,
                                                        watch_engine_reduces)
from caramel.strategies.pipeline.timing import StageTimer, bubble_fractions
from caramel.strategies.pipeline.tied import share_tied
from caramel.strategies.pipeline.units import traced_stages, with_cut_units
from caramel.strategies.pipeline.unequal import ReplicatedLayout, VirtualPipelines, make_replicated_layout
from caramel.strategies.pipeline.planner import PartitionPlan
from caramel.strategies.pipeline.runtime_planning import PipelinePlanning
from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec

OptimizerLike = torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer]
_SYNC = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class Pipeline(PipelinePlanning):
    """One rank's part of a pipeline: its stage(s), its groups, its optimizer."""

    def __init__(self, model: nn.Module, optimizer: OptimizerLike, options: PipelineOptions, *,
                 process_group: Any = None, cluster: ClusterSpec | None = None,
                 profile: ModelProfile | None = None) -> None:
        cuts = options.boundaries()
        if not isinstance(model, nn.Sequential) and cuts and not isinstance(cuts[0], str):
            raise CaramelError(f"pipeline: a {type(model).__name__} is no nn.Sequential: layer indices {cuts} do not "
                               f"apply; name the modules that begin stages 1.. (partition='layers.2+...') or use "
                               f"partition='auto'")
        if options.schedule == "pipedream" and not options.auto_replicas and options.workers() > options.stages:
            raise CaramelError("pipeline: schedule=pipedream runs without replicas (replicas=1)")
        self.model, self.options, self.cluster = model, options, cluster
        if profile is not None and not isinstance(model, nn.Sequential):
            profile = with_cut_units(profile, model)
        self.plan_profile = profile  # plan from it (as the simulator does) instead of profiling
        self._optimizer_arg = optimizer
        self.optimizer: torch.optim.Optimizer | None = optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
        if self.optimizer is None and not callable(optimizer):
            raise CaramelError(f"pipeline: optimizer must be a torch optimizer or a function params -> optimizer, "
                               f"got {type(optimizer).__name__}")
        self.process_group = process_group
        self.layout: Layout | ReplicatedLayout | None
        self.replica_choice: Any = None  # replicas="auto": the chosen plan and every candidate's simulated step
        self._split_batch = 1  # replicas="auto" chose r equal counts: each of the r pipelines takes 1/r of the batch
        if options.auto_replicas:  # the groups are made once the counts are chosen, at the first step
            self.layout = None
        elif options.unequal_replicas:  # one count per stage: virtual pipelines (unequal.py)
            self.layout = make_replicated_layout(options.replica_counts(), process_group)
        else:
            self.layout = make_layout(options.stages, options.replicas, options.schedule == "interleaved",
                                      process_group)
        self.device = next(model.parameters()).device
        if options.schedule == "pipedream" and self.device.type != "cpu":
            raise CaramelError(f"pipeline: schedule=pipedream runs on CPU tensors (gloo point to point); "
                               f"this model is on {self.device}")
        self.microbatch_predictions_s: dict[int, float] = {}  # microbatches="auto": candidate -> simulated step
        self.partition: PartitionPlan | None = None  # the planner's, when partition="auto"
        self.boundaries: list[int] | list[str] | None = cuts
        self.stage_modules: list[nn.Module] = []
        self._runner: Any = None
        self.timer: StageTimer | None = None  # synchronous schedules: each compute action timed
        self._loss_fn: Callable | None = None
        self._engine: Any = None  # replicas reduced by Caramel's engine: the engine of this rank's stage
        self._tied: Any = None  # `TiedGrads` when a tied weight's uses are on different stages
        self.closed = False
        from caramel.strategies.api import DEFAULT_SESSION

        DEFAULT_SESSION.register(self)  # caramel.shutdown() and the exit handler close it (`release`)

    # --- the step ---------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> torch.Tensor:
        """One training step on this pipeline's batch (every rank passes it): the loss, averaged
        over microbatches (and replicas), returned on every rank."""
        self._check_open()
        self.prepare(inputs, targets, loss_fn)
        inputs, targets = self._own_part(inputs, targets)
        m = self.options.microbatches
        if inputs.shape[0] % m or targets.shape[0] != inputs.shape[0]:
            raise CaramelError(f"pipeline: the batch ({inputs.shape[0]} inputs, {targets.shape[0]} targets) must "
                               f"split into microbatches={m} equal parts")
        if self.options.schedule == "pipedream":
            local = self._runner.step(inputs, targets, loss_fn)
        else:
            local = self._sync_step(inputs, targets)
        return self._share_loss(local)

    def prepare(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> None:
        """Cut the model and build this rank's stage(s) for batches like `inputs` (the first
        `step` does it too); a training loop calls it early to know `stage_modules` before the
        first step, e.g. to load each stage's optimizer state. Every rank calls it."""
        self._check_open()
        if self._runner is None:
            if self.layout is None:
                self._choose_replicas(inputs, targets, loss_fn)
            inputs, targets = self._own_part(inputs, targets)
            if self.options.microbatches == "auto":
                self._choose_microbatches(inputs, targets, loss_fn)
            m = self.options.microbatches
            if inputs.shape[0] % m or targets.shape[0] != inputs.shape[0]:
                raise CaramelError(f"pipeline: the batch ({inputs.shape[0]} inputs, {targets.shape[0]} targets) must "
                                   f"split into microbatches={m} equal parts")
            self._build(inputs[: inputs.shape[0] // m], targets[: targets.shape[0] // m], loss_fn)
        elif loss_fn is not self._loss_fn:
            raise CaramelError("pipeline: step() got another loss_fn than at the first step; make a new pipeline")

    def _own_part(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """replicas="auto" with r equal counts runs r pipelines, each on its replica's r-th of the
        batch every rank passes; otherwise the batch itself."""
        r = self._split_batch
        if r == 1:
            return inputs, targets
        if inputs.shape[0] % r or targets.shape[0] != inputs.shape[0]:
            raise CaramelError(f"pipeline: replicas=auto chose {r} equal replicas per stage: the batch "
                               f"({inputs.shape[0]} inputs, {targets.shape[0]} targets) must split into {r} equal parts")
        j, n = self.layout.replica, inputs.shape[0] // r
        return inputs[j * n:(j + 1) * n], targets[j * n:(j + 1) * n]

    def _sync_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        last = self.layout.holds_last(self.options.stages)
        losses: list[torch.Tensor] = []
        if isinstance(self._runner, VirtualPipelines):  # the sum of this rank's microbatch losses
            return self._runner.step(inputs.to(self.device), targets.to(self.device), self.optimizer)
        args = (inputs.to(self.device),) if self.layout.holds_first else ()
        self._runner.step(*args, target=targets.to(self.device) if last else None, losses=losses if last else None,
                          return_outputs=False)
        if self.timer is not None:
            self.timer.end_step()
        if self._engine is not None:
            broadcast_buffers(self.stage_modules[0], self.layout.replica_group)
        if self._tied is not None:  # after the microbatches' accumulation and the replicas' reduction
            self._tied.reduce()
        self.optimizer.step()
        return torch.stack(losses).mean().detach() if last else None

    def _share_loss(self, local: torch.Tensor | None) -> torch.Tensor:
        """The last stage's loss, broadcast along the pipeline, then averaged over replicas."""
        lay = self.layout
        loss = local.detach().clone().float() if local is not None else torch.zeros((), dtype=torch.float32)
        loss = loss.to(self.device)
        if isinstance(self._runner, VirtualPipelines):
            return self._runner.share_loss(loss)
        src = lay.pipeline_ranks[(self.options.stages - 1) % lay.positions]
        dist.broadcast(loss, src=src, group=lay.pipeline_group)
        if lay.replica_group is not None:
            dist.all_reduce(loss, group=lay.replica_group)
            loss /= lay.replicas
        return loss

    # --- building the stages at the first step ----------------------------------------------

    def _build(self, sample: torch.Tensor, sample_targets: torch.Tensor, loss_fn: Callable) -> None:
        if self.boundaries is None:
            self.boundaries = self._plan_boundaries(sample, sample_targets, loss_fn)
        if self.options.partition == "auto":  # `options` is then the whole layout: rebuilding from it keeps the cut
            self.options = dataclasses.replace(self.options, partition="+".join(map(str, self.boundaries)))
        tied = []
        if isinstance(self.boundaries[0] if self.boundaries else 0, str):
            stages, tied = traced_stages(self.model, self.boundaries, self.options.stages, sample.to(self.device))
        else:  # a tied parameter of two children is the same Parameter on both stages: summed all the same
            stages = split_sequential(self.model, self.boundaries)
            tied = share_tied(self.model, stages)
        self.stage_modules = [stages[i] for i in self.layout.stage_indices]
        if tied:
            self._tie(tied)
        params = list({id(p): p for m in self.stage_modules for p in m.parameters()}.values())  # each once
        if self.optimizer is None:
            self.optimizer = self._optimizer_arg(params)
        self._loss_fn = loss_fn
        lay, n = self.layout, self.options.stages
        if self.options.schedule == "pipedream":
            self._runner = PipeDreamStage(self.stage_modules[0], lay.stage_indices[0], n, self.optimizer,
                                          lay.pipeline_ranks, lay.pipeline_group, self.options.microbatches,
                                          vertical_sync=self.options.vertical_sync)
            return
        if isinstance(lay, ReplicatedLayout):
            self.timer = StageTimer()
            self._runner = VirtualPipelines(self.stage_modules[0], lay, n, self.device, self.options.schedule,
                                            self.options.microbatches, loss_fn, self.timer)
            return
        scale_grads = True  # torch's schedule divides the gradients by the microbatch count
        if lay.replica_group is not None and self.options.replica_reducer() == "caramel" and self._tied is None:
            # Caramel's engine on the replica group; it folds that division into the reduction
            torch_stages = [self._caramel_stage(stages, sample, sample_targets, loss_fn)]
            scale_grads = False
        else:
            # hybrid: torch's stage runs a DDP-wrapped module with no_sync() for all but the last
            # microbatch's backward, so the replicas average their gradients once per step
            runs = [m if lay.replica_group is None else
                    nn.parallel.DistributedDataParallel(m, process_group=lay.replica_group)
                    for m in self.stage_modules]
            stage_cls = KeepBuffersStage if lay.replica_group is None else DDPStage
            torch_stages = [stage_cls(m, i, n, self.device, group=lay.pipeline_group)
                            for m, i in zip(runs, lay.stage_indices)]
        m = self.options.microbatches
        try:
            if self.options.schedule == "interleaved":
                self._runner = ScheduleInterleaved1F1B(torch_stages, m, loss_fn=loss_fn)
            else:
                self._runner = _SYNC[self.options.schedule](torch_stages[0], m, loss_fn=loss_fn,
                                                            scale_grads=scale_grads)
        except ValueError as e:  # torch's own checks of microbatches against stages
            raise CaramelError(f"pipeline: schedule={self.options.schedule}, stages={n}, "
                               f"microbatches={self.options.microbatches}: {e}") from None
        self.timer = StageTimer()
        for st in torch_stages:
            self.timer.wrap_stage(st)
        self.timer.wrap_loss(self._runner)
        if self._engine is not None:
            watch_engine_reduces(self.timer, self._engine)

    def _tie(self, tied: list) -> None:
        """Tied weights on several stages: sum their gradients over the holders each step
        (`tied.py`); refuse where a step's update is not one optimizer step after that sum."""
        from caramel.strategies.pipeline.tied import TiedGrads, shared_positions

        o, lay = self.options, self.layout
        what = "; ".join(" = ".join(w.names) for w in tied)
        shared = shared_positions(tied, lay.positions) if not isinstance(lay, ReplicatedLayout) else []
        if shared:
            where = "; ".join(f"{' = '.join(w.names)} on stages {list(w.stages)}" for w in shared)
            raise CaramelError(f"pipeline: one rank would hold two stages that use the same tied weight ({where}), "
                               f"whose gradient torch's schedule scales once per stage; use a partition that "
                               f"puts those uses on one stage or on stages of different ranks, or a schedule "
                               f"with one stage per rank ('1f1b' or 'gpipe')")
        if o.schedule == "pipedream":
            raise CaramelError(f"pipeline: schedule=pipedream cannot train a tied weight split across stages "
                               f"({what}): its stages step apart, on stashed weight versions, so the copies would "
                               f"drift; use schedule='1f1b' or 'gpipe', or cut so every use is on one stage")
        if isinstance(lay, ReplicatedLayout):
            raise CaramelError(f"pipeline: replicas={o.replicas} (unequal counts) cannot train a tied weight split "
                               f"across stages ({what}); use equal replicas or cut so every use is on one stage")
        if lay.replica_group is not None and o.replica_reduce == "caramel":
            raise CaramelError(f"pipeline: replica_reduce='caramel' defers each update past the step and cannot sum "
                               f"a tied weight split across stages ({what}); use replica_reduce='ddp' (or 'auto')")
        self._tied = TiedGrads(self.model, tied, lay.positions, lay.replicas, lay.replica, self.process_group)

    def _caramel_stage(self, stages: list[nn.Module], sample: torch.Tensor, sample_targets: torch.Tensor,
                       loss_fn: Callable) -> PipelineStage:
        """This rank's one stage, its replicas reduced by Caramel's engine (`replica_reduce.py`)."""
        from caramel.strategies.pipeline.replica_reduce import (CaramelStage, caramel_replicas, stage_input,
                                                                stage_plan_source)

        lay, (index,) = self.layout, self.layout.stage_indices
        last = index == self.options.stages - 1
        args = stage_input(stages, index, sample.to(self.device))
        source = stage_plan_source(stages[index], args, sample_targets.to(self.device), loss_fn if last else None,
                                   lay.replicas)
        self._engine = caramel_replicas(stages[index], self.optimizer, lay.replica_group, lay.replicas,
                                        self.options.microbatches, source)
        return CaramelStage(stages[index], index, self.options.stages, self.device, self._engine,
                            group=lay.pipeline_group)

    def close(self) -> None:
        """Destroy the process groups this pipeline made (its virtual pipelines, or a hybrid's
        pipeline and replica groups) and release Caramel's engine, if it reduces the replicas;
        pending updates are applied first. Local to the rank (no collective), idempotent; the
        pipeline cannot step or gather afterwards. `caramel.shutdown()` and the exit handler
        close every pipeline still open."""
        if self.closed:
            return
        with contextlib.suppress(Exception):  # a dead peer at exit: nothing left to apply
            self.flush()
        self.closed = True
        if self._engine is not None:
            self._engine.release()
        self._runner = None  # DDP and torch's stages hold the groups; drop them before the groups go
        if self._tied is not None:
            with contextlib.suppress(Exception):
                self._tied.close()
        for group in self.layout.created if self.layout is not None else ():
            with contextlib.suppress(Exception):  # the job's default group may be gone already at exit
                dist.destroy_process_group(group)

    release = close  # the name `Session.shutdown` calls

    def _check_open(self) -> None:
        if self.closed:
            raise CaramelError("pipeline: closed (close() or caramel.shutdown() destroyed its process groups); "
                               "make a new caramel.pipeline(...) to train on")

    def flush(self) -> None:
        """Apply every update Caramel's engine still holds (the caramel replica reduction defers each
        to the next step's forward); a no-op otherwise. Reading or loading parameters does it."""
        if self._engine is not None:
            self._engine.synchronize()

    # --- measured bubble ----------------------------------------------------------------------

    def bubble_stats(self) -> dict[str, Any]:
        """The measured bubble fraction of each position of this rank's pipeline (median over
        the steps so far, the first left out as warm-up), see `timing.py` for the definition.
        A collective along the pipeline: all its ranks call it (replicas="auto" before its first step:
        no steps, no collective)."""
        self._check_open()
        if self.layout is None:  # replicas="auto" before its first step: no layout, no step measured yet
            return bubble_fractions([[]])
        mine = [(s.span_s, s.busy_s) for s in self.timer.steps] if self.timer is not None else []
        group, size = self.layout.gather_group
        parts: list[Any] = [None] * size
        dist.all_gather_object(parts, mine, group=group)
        out = bubble_fractions(parts)  # unequal replicas: per rank, stage-major
        m, p = self.options.microbatches, self.layout.positions
        if self.options.schedule in ("gpipe", "1f1b") and not self.options.unequal_replicas:
            out["bubble_fraction_ideal"] = (p - 1) / (m + p - 1)  # equal stages, free transfers
        return out

    # --- the whole model's state --------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state on every rank: each position contributes its stages' tensors
        (CPU copies), gathered along the pipeline, in the model's own key order."""
        self._check_open()
        self.flush()
        if not self.stage_modules:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        own: dict[str, torch.Tensor] = {}
        for m in self.stage_modules:
            own.update({k: v.detach().cpu().clone() for k, v in m.state_dict().items()})
        group, size = self.layout.gather_group
        parts: list[Any] = [None] * size
        dist.all_gather_object(parts, own, group=group)
        merged = {k: v for part in parts for k, v in part.items()}
        return {k: merged[k] for k in self.model.state_dict()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load the whole model's state (every rank passes all of it; each keeps its stages')."""
        self.flush()  # a pending update must not land on the loaded parameters
        self.model.load_state_dict(state)
        if self._runner is not None and self.options.schedule == "pipedream":
            self._runner.reset_versions()


def parallelize_pipeline(model: nn.Module, optimizer: torch.optim.Optimizer, options: PipelineOptions,
                         **common: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The registry's `parallelize` entry: a pipeline is no (model, optimizer) pair that a user's
    own loop can step (one forward and backward per rank cannot run microbatches across ranks),
    so this says what to call instead."""
    raise CaramelError(f"strategy 'pipeline' splits the model across workers: use caramel.pipeline(model, optimizer, "
                       f"stages={options.stages}, microbatches={options.microbatches}, schedule={options.schedule!r}) "
                       f"and its step(inputs, targets, loss_fn); `caramel bench --strategies pipeline:...` runs it so")


def pipeline(model: nn.Module, optimizer: OptimizerLike, stages: int = 2, microbatches: int | str = "auto",
             schedule: str = "1f1b", partition: str | list[int] = "auto", *, replicas: int | str | list[int] = 1,
             replica_reduce: str = "auto", vertical_sync: bool = False, process_group: Any = None,
             cluster: ClusterSpec | None = None, profile: ModelProfile | None = None,
             options: PipelineOptions | None = None) -> Pipeline:
    """Cut `model` (an `nn.Sequential`, or any model torch's tracer can split at the modules
    `partition` names) into `stages` across the ranks of `process_group` and
    return the `Pipeline` that trains it; see `PipelineOptions` for the knobs. `optimizer` is
    the whole model's optimizer or a function that makes one from a stage's parameters;
    `cluster`: the links and worker speeds to plan for (default: 1 Gbit/s, equal workers);
    `profile`: a `caramel.profile_model` profile of the model (its top-level modules) to plan
    the cut, the microbatches and the replicas from, as `caramel simulate` does, instead of
    profiling at the first step; `options`, a ready `PipelineOptions`, replaces the option
    keywords."""
    from caramel.strategies.options import build_options

    if not dist.is_initialized():
        raise CaramelError("pipeline: torch.distributed is not initialized; call caramel.init_distributed() first")
    if options is not None:
        return Pipeline(model, optimizer, options, process_group=process_group, cluster=cluster, profile=profile)
    if not isinstance(partition, str):
        partition = "+".join(str(p) for p in partition) if isinstance(partition, (list, tuple)) else partition
    opts = build_options(PipelineOptions, dict(stages=stages, microbatches=microbatches, schedule=schedule,
                                               partition=partition, replicas=replicas, replica_reduce=replica_reduce,
                                               vertical_sync=vertical_sync),
                         where="pipeline")
    return Pipeline(model, optimizer, opts, process_group=process_group, cluster=cluster, profile=profile)
