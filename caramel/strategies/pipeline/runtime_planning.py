"""How a `Pipeline` plans at its first step: the replica counts, the microbatch count and the
cut, each chosen on the job's first rank and sent to every rank (`first_rank_plans`).

`PipelinePlanning` is a mixin of `runtime.Pipeline`: its methods read and set the pipeline's
`options`, `layout`, `boundaries`, `partition`, `cluster` and `plan_profile`, and are kept here
so that the runtime module holds the step, the stages and the state only.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.strategies.pipeline.layout import make_layout, stage_speeds
from caramel.strategies.pipeline.planner import PartitionPlan, balanced_boundaries, layer_costs_from_profile
from caramel.strategies.pipeline.sharing import shares_cores
from caramel.strategies.pipeline.profile_costs import profiled_cuts, scaling_from_profile, tied_weights
from caramel.strategies.pipeline.unequal import make_replicated_layout
from caramel.topology.spec import ClusterSpec


class PipelinePlanning:
    """The first step's choices of a `Pipeline` (the replicas, the microbatches, the cut)."""

    def _choose_replicas(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> None:
        """replicas="auto": the job's first rank chooses the cut and counts, every rank receives
        them (`auto_replicas.agree_on_replicas`) and builds the layout: equal counts r as a hybrid
        of r pipelines (each on its r-th of the batch), unequal ones as virtual pipelines."""
        from caramel.strategies.pipeline.auto_replicas import agree_on_replicas

        o = self.options
        choice, names = agree_on_replicas(self.model, o, inputs, targets, loss_fn, self.cluster, self.plan_profile,
                                          self.process_group)
        counts, m = choice.counts, choice.microbatches
        self.replica_choice, self.partition = choice, choice.plan
        self.boundaries = child_indices(self.model, names) if isinstance(self.model, nn.Sequential) else names
        if len(set(counts)) == 1:
            r = counts[0]
            self.options = dataclasses.replace(o, stages=len(counts), replicas=r, microbatches=m // r)
            self.layout = make_layout(len(counts), r, False, self.process_group)
            self._split_batch = r
        else:
            self.options = dataclasses.replace(o, stages=len(counts), replicas="+".join(map(str, counts)),
                                               microbatches=m)
            self.layout = make_replicated_layout(tuple(counts), self.process_group)

    def _choose_microbatches(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> None:
        """microbatches="auto": the job's first rank profiles a copy of the model at the largest
        and the smallest candidate microbatch, fits each layer's fixed and per-sample cost, and
        lets the simulator pick the count (and, with partition="auto", the cut for it); every
        rank receives both."""
        from caramel.strategies.pipeline.microbatches import candidates

        o, lay = self.options, self.layout
        if self.plan_profile is None and (not isinstance(self.model, nn.Sequential)
                                          or (self.boundaries and isinstance(self.boundaries[0], str))):
            raise CaramelError("pipeline: microbatches='auto' profiles the layers of an nn.Sequential; give a count "
                               "(microbatches=4) for a model cut by torch's tracer")
        batch = inputs.shape[0]
        cands = candidates(batch, o.schedule, o.stages, lay.positions, o.replica_period if o.unequal_replicas else 1)
        # one candidate: nothing to simulate, unless the cut is chosen with it at the speeds a shared host settles at
        only = len(cands) == 1 and not (self.boundaries is None and shares_cores(self._cluster_and_speeds()[0]))
        m, plan, table = first_rank_plans(
            lambda: (cands[0], None, {}) if only else self._simulate_counts(inputs, targets, loss_fn, cands),
            self.process_group, "microbatches='auto'")
        self.microbatch_predictions_s = table  # candidate -> simulated step (s)
        if plan is not None and self.boundaries is None:
            self.partition, self.boundaries = plan, self._cut_names(plan.boundaries)
        self.options = dataclasses.replace(o, microbatches=m)

    def _simulate_counts(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable,
                         cands: list[int]) -> tuple[int, PartitionPlan, dict[int, float]]:
        from caramel.strategies.pipeline.microbatches import choose_microbatches, profiled_scaling

        o, lay = self.options, self.layout
        cluster, per_stage = self._cluster_and_speeds()
        fixed_cuts = list(self.boundaries) if self.boundaries is not None else None
        optimizer_s, ties = 0.0, []  # profiled here: its layers' lines only
        if self.plan_profile is not None:  # the simulator's costs, optimizer step and tied weights
            names, layers = scaling_from_profile(self.plan_profile)
            fixed_cuts = profiled_cuts(names, fixed_cuts) if fixed_cuts is not None else None
            optimizer_s, ties = self.plan_profile.optimizer_time_s or 0.0, tied_weights(self.plan_profile, names)
        else:
            layers = profiled_scaling(self.model, inputs, targets, loss_fn, cands)
        choice = choose_microbatches(layers, inputs.shape[0],
                                     o.schedule, o.stages, lay.positions, cluster, per_stage, fixed_cuts,
                                     o.replica_counts() if o.unequal_replicas else o.replicas,
                                     optimizer_s=optimizer_s, ties=ties, reducer=o.replica_reducer())
        return choice.microbatches, choice.plan, choice.predicted_step_s

    def _cluster_and_speeds(self) -> tuple[ClusterSpec, list[float]]:
        cluster = self.cluster or ClusterSpec.uniform(self.layout.positions, 1e9)
        # each stage at its slowest worker's speed, the workers taken by this layout's ranks
        return cluster, stage_speeds([w.speed for w in cluster.workers], self.options.replica_counts(),
                                     self.layout.positions)

    def _plan_speeds(self) -> list[float]:
        """Each stage's speed for the partitioner: its slowest worker's, times its replica count
        with unequal counts (a stage on r replicas runs 1/r of the microbatches)."""
        per_stage = self._cluster_and_speeds()[1]
        if self.options.unequal_replicas:
            per_stage = [sp * r for sp, r in zip(per_stage, self.options.replica_counts())]
        return per_stage

    def _cut_names(self, cuts: list[int]) -> list[int] | list[str]:
        """A plan's cut as the runtime takes it: planned on the handed profile, cuts index its
        top-level layers, given back as the layer index (an `nn.Sequential`'s child) or the
        module name (a traced model) that begins each stage; otherwise as they are."""
        if self.plan_profile is None:
            return list(cuts)
        names, _ = scaling_from_profile(self.plan_profile)
        if isinstance(self.model, nn.Sequential):
            return child_indices(self.model, [names[c] for c in cuts])
        return [names[c] for c in cuts]

    def _plan_boundaries(self, sample: torch.Tensor, sample_targets: torch.Tensor,
                         loss_fn: Callable) -> list[int] | list[str]:
        """partition="auto": the job's first rank profiles the model on one microbatch (a copy, so
        the real one is untouched), cuts it with `balanced_boundaries` (speeds from the cluster
        spec, if any) and sends the cut to every rank: layer indices for an `nn.Sequential`, the
        names of the modules that begin stages 1.. for any other model (`units.py`)."""
        from caramel.profile.profiler import profile_model
        from caramel.strategies.pipeline.units import forward_units, unit_costs

        def plan() -> tuple[PartitionPlan, list[int] | list[str] | None]:
            if self.plan_profile is not None:  # the simulator's costs
                _, layers = scaling_from_profile(self.plan_profile)
                plan = balanced_boundaries([c.at(sample.shape[0]) for c in layers], self._plan_speeds(),
                                           self._cluster_and_speeds()[0])
                return plan, self._cut_names(plan.boundaries)
            probe = copy.deepcopy(self.model)
            prof = profile_model(probe, sample, sample_targets, loss_fn, steps=5, name="pipeline")
            sequential = isinstance(probe, nn.Sequential)
            units = None if sequential else forward_units(probe, sample)
            costs = layer_costs_from_profile(prof, probe, sample) if sequential else unit_costs(prof, probe, units, sample)
            plan = balanced_boundaries(costs, self._plan_speeds(), self._cluster_and_speeds()[0])
            return plan, None if units is None else [units[i].name for i in plan.boundaries]

        self.partition, names = first_rank_plans(plan, self.process_group, "partition='auto'")
        return list(self.partition.boundaries) if names is None else names


def child_indices(model: nn.Sequential, names: list[str]) -> list[int]:
    """The positions of an `nn.Sequential`'s children named `names` (its children need not be
    named by their index: `nn.Sequential(OrderedDict(...))`)."""
    children = [n for n, _ in model.named_children()]
    return [children.index(n) for n in names]


def first_rank_plans(plan: Callable[[], Any], group: Any, what: str) -> Any:
    """`plan()` on the group's first rank, its result sent to every rank; if it fails there,
    every rank raises the same error (the others would otherwise wait for the result forever)."""
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    box: list[Any] = [None]
    if dist.get_rank() == ranks[0]:
        try:
            box[0] = ("ok", plan())
        except CaramelError as e:
            box[0] = ("error", str(e))
        except Exception as e:  # noqa: BLE001 - any failure must reach every rank
            box[0] = ("error", f"pipeline: {what}: planning failed on rank {ranks[0]}: {type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=ranks[0], group=group)
    status, value = box[0]
    if status == "error":
        raise CaramelError(value)
    return value
