"""How the harness runs a strategy: `caramel.parallelize(model, optimizer, strategy)` on a fresh
model and optimizer (identical on every rank), wrapped in a `Runner` whose timed `step()` is the
user's ordinary training step. Every registered strategy runs this way, `ddp` (torch's own
DistributedDataParallel) included, so the bench measures what users run.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.bench.baselines import Runner, plain_step, sync_device
from caramel.bench.matrix import Strategy
from caramel.errors import CaramelError
from caramel.strategies.ps.options import ASP_BOUND_STEPS


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
    pipeline_cluster: Any = None
    """the ClusterSpec pipelines plan at (`caramel.bench.pipeline_plan`); None: the runtime's default"""
    pipeline_profile: Any = None
    """the job's profile, which pipelines plan from as the predictions do; None: they profile themselves"""
    steps_per_block: int | None = None
    """the timed steps of a bench block (`steps_per_round`): an ssp bound a block cannot reach
    makes it time its drain like asp (`steady_entry`); None: no such cut"""


class TrainRunner(Runner):
    """A wrapped model + optimizer stepping on one fixed batch."""

    def __init__(self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, inputs, targets,
                 loss_fn: Callable, device: torch.device, finish: Callable[[], None] | None = None,
                 stats: Callable[[], dict[str, Any]] | None = None, settled: Callable[[], bool] | None = None,
                 close: Callable[[], None] | None = None):
        self.name = name
        self.model, self.optimizer = model, optimizer
        self.inputs, self.targets, self.loss_fn = inputs, targets, loss_fn
        self.device = device
        self._finish = finish
        self._stats = stats
        self._settled = settled
        self._close = close

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

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()
        # the wrapped model (a DDP sits in reference cycles) becomes garbage for the next gc.collect()
        self.model = self.optimizer = self._finish = self._stats = self._settled = None


def baseline_group(ctx: StrategyContext):
    """The group the comm-only and concurrent baselines run on, and its priority: on CPU, a gloo
    group of their own whose threads get the priority the engine gives its own by default
    (`comm_priority="auto"`), so that the baselines measure communication as the engine's runs;
    elsewhere (or alone) the job's own group."""
    from caramel.strategies.ddp.runtime import ddp_group

    if ctx.device.type != "cpu" or ctx.world_size == 1:
        return ctx.process_group, None
    return ddp_group("auto", ctx.process_group, ctx.device)


def trace_file_stem(strategy_name: str) -> str:
    """The file name (without `.json`) a strategy's timeline gets: its name with only safe characters."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in strategy_name)


def _trace_path(ctx: StrategyContext, strategy: Strategy) -> str | None:
    if not ctx.trace_dir:
        return None
    # The engine adds `.rank{r}.json` when world > 1.
    return str(Path(ctx.trace_dir) / f"{trace_file_stem(strategy.name)}.json")


def build_strategy(strategy: Strategy, model, optimizer, inputs, targets, loss_fn, ctx: StrategyContext) -> Runner:
    """The runner for `strategy`, through `caramel.parallelize` like any user's loop;
    StrategyUnavailable when it cannot run here (e.g. real-time priority refused on some rank,
    or thread priority asked for CUDA tensors): the bench reports why and goes on."""
    import caramel

    spec = strategy.spec()
    if spec.info.name == "pipeline":
        return _pipeline_runner(strategy, model, optimizer, inputs, targets, loss_fn, ctx)
    extra = {"trace": _trace_path(ctx, strategy)} if spec.info.records_trace else {}
    try:
        wrapped, opt = caramel.parallelize(model, optimizer, spec.info.name, options=spec.options,
                                           process_group=ctx.process_group, **extra)
    except CaramelError as e:
        raise StrategyUnavailable(str(e)) from None
    engine = getattr(opt, "engine", None)
    prio = getattr(wrapped, "comm_priority", None)

    # the ps strategy's run (TicTac's E and S, staleness, shard loads) or the gossip strategy's
    # (consensus distance, bytes per peer, mixing rate)
    reporter = getattr(opt, "ps", None) or getattr(opt, "gossip", None)

    def stats() -> dict[str, Any]:
        if engine is not None:
            return engine_stats(engine)
        if reporter is not None:
            return dict(reporter.stats_dict())
        return {"comm_priority": prio.to_dict()} if prio is not None else {}

    def settled() -> bool:
        if engine is None:
            return True
        from caramel.runtime import schedule_settled
        return schedule_settled(opt)

    def close() -> None:
        if spec.info.name == "ddp" and prio is not None:  # ddp_group made this gloo group for this DDP alone
            dist.destroy_process_group(wrapped.process_group)

    if getattr(spec.options, "balance", "off") == "batch":
        from caramel.bench.straggler import BalancedRunner
        runner: TrainRunner = BalancedRunner(strategy.name, wrapped, opt, inputs, targets, loss_fn, ctx.device,
                                             ctx.world_size, finish=opt.synchronize, stats=stats, settled=settled)
    else:
        runner = TrainRunner(strategy.name, wrapped, opt, inputs, targets, loss_fn, ctx.device,
                             finish=opt.synchronize, stats=stats, settled=settled, close=close)
    runner.entry_steps, runner.drain_timed = steady_entry(getattr(opt, "ps", None), ctx.steps_per_block)
    return runner


def steady_entry(ps_run: Any, steps_per_block: int | None = None) -> tuple[int, bool]:
    """How a block of this strategy starts in its steady state (`caramel.bench.blocks`): the
    entry steps and whether the drain is timed. A step may leave S updates outstanding under
    the ps strategy's `ssp:S` (its `step()` waits for update t - S), so S + 1 entry steps; asp
    has no bound short of its memory bound (32 updates, more steps than a block), so no entry
    step and a timed drain; every other strategy (bsp included): 1, untimed. An `ssp:S` whose
    S + 1 entry steps would be as many as the block's `steps_per_block`, or whose S reaches
    asp's bound, is asp within a block (the untimed entry would carry the block): it is timed
    as asp is, which also spares it S + 1 untimed steps a block."""
    if ps_run is None:
        return 1, False
    bound = ps_run.options.staleness_bound()
    if bound == 0:  # bsp, ssp:0: one entry step, as every strategy without stale updates
        return 1, False
    if bound is None or bound >= ASP_BOUND_STEPS or (steps_per_block is not None and bound + 1 >= steps_per_block):
        return 0, True
    return bound + 1, False


def ctx_rank() -> int:
    """This process's rank (0 outside a process group): only rank 0 prints."""
    return dist.get_rank() if dist.is_initialized() else 0


class PipelineRunner(Runner):
    """`caramel.pipeline`'s own step (microbatches across the stages, then the update)."""

    def __init__(self, name: str, pipe: Any, inputs, targets, loss_fn: Callable, device: torch.device,
                 trace_dir: str | None = None):
        self.name, self.pipe = name, pipe
        self.inputs, self.targets, self.loss_fn, self.device = inputs, targets, loss_fn, device
        self.trace_dir = trace_dir

    def step(self) -> None:
        self.pipe.step(self.inputs, self.targets, self.loss_fn)
        sync_device(self.device)

    def prepare(self) -> None:
        """Cut and build the stages now (every rank), so that a model the pipeline cannot run
        (e.g. pipedream with a tied weight split across stages) is refused while the bench builds strategies,
        not in the middle of a measurement; then say what the planner chose."""
        self.pipe.prepare(self.inputs, self.targets, self.loss_fn)
        if self.pipe.replica_choice is not None and ctx_rank() == 0:
            c = self.pipe.replica_choice
            table = ", ".join(f"{k}: {1e3 * t:.1f}" for k, t in c.candidates_s.items())
            print(f"[bench] {self.name}: replicas=auto chose {'+'.join(map(str, c.counts))}, {c.microbatches} "
                  f"microbatches, cut {self.pipe.boundaries} (simulated step ms by stages x microbatches: {table})",
                  file=sys.stderr, flush=True)
        if self.pipe.microbatch_predictions_s and ctx_rank() == 0:
            table = ", ".join(f"{m}: {1e3 * t:.1f}" for m, t in self.pipe.microbatch_predictions_s.items())
            print(f"[bench] {self.name}: microbatches=auto chose {self.pipe.options.microbatches}, cut "
                  f"{self.pipe.boundaries} (simulated step ms by count: {table})", file=sys.stderr, flush=True)

    def stats(self) -> dict[str, Any]:
        plan = self.pipe.partition
        m = self.pipe.options.microbatches
        from caramel.bench.pipeline_plan import cluster_summary

        out = {"boundaries": self.pipe.boundaries, "microbatches": m, "replicas": self.pipe.options.replicas,
               "stages": self.pipe.options.stages, "planned_at": cluster_summary(self.pipe.cluster),
               "predicted_slowest_stage_s": plan.slowest_s if plan is not None else None,
               # the partitioner's compute per step of each stage (a replica's share with replicas;
               # replicas=auto: its per-step stage times, the all-reduce included)
               "predicted_busy_s_per_stage": (None if plan is None else list(plan.stage_times_s)
                                              if self.pipe.replica_choice is not None
                                              else [t * m for t in plan.stage_times_s]),
               "replica_candidates_s": (self.pipe.replica_choice.candidates_s
                                        if self.pipe.replica_choice is not None else None),
               **self.pipe.bubble_stats()}  # every rank calls stats(), in one order: a collective is safe
        if self.trace_dir and self.pipe.timer is not None:
            self._save_actions()
        if ctx_rank() == 0 and out.get("bubble_fraction") is not None:
            print(f"[bench] {self.name}: measured bubble {out['bubble_fraction']:.3f} per stage "
                  f"{[round(f, 3) for f in out['bubble_fraction_per_stage']]} (textbook "
                  f"{out.get('bubble_fraction_ideal', float('nan')):.3f})", file=sys.stderr, flush=True)
            # the partitioner's stage times (at the speeds it planned at; replicas=auto: all-reduce
            # included), not the simulator's busy time, which the report sets beside the measured
            predicted = [round(1e3 * t, 1) for t in out["predicted_busy_s_per_stage"] or []] or None
            print(f"[bench] {self.name}: cut {self.pipe.boundaries}, the partitioner's ms per stage {predicted}, "
                  f"measured busy ms per rank {[round(1e3 * b, 1) for b in out.get('busy_s_per_stage', [])]}",
                  file=sys.stderr, flush=True)
        return out

    def _save_actions(self) -> None:
        """This rank's timed compute actions of the kept steps (`StepTiming.actions`: kind, stage,
        microbatch, start, end on the host's monotonic clock), to compare with the simulator's lanes.
        `caramel.pipeline_actions/1`: those only. `/2`, where Caramel's engine reduces the stage:
        also its plan (`reduce_plan`: bucket, chunk, bytes in issue order) and each step's
        collectives (`reduces`: bytes, issue, done), those completed by now; the last step's may
        still be on the wire, and `reduces_last_step_partial` says whether it holds fewer than
        the plan's (readers drop that step's then)."""
        timer = self.pipe.timer
        steps = [[list(a) for a in st.actions] for st in timer.steps]
        record: dict[str, Any] = {"format": "caramel.pipeline_actions/1", "strategy": self.name, "rank": ctx_rank(),
                                  "steps": steps}
        if timer.watching_reduces:  # Caramel's engine reduces this rank's stage: its plan and each step's collectives
            timer.take_reduces()  # those completed since the last step ended
            record["format"] = "caramel.pipeline_actions/2"
            record["reduce_plan"] = [list(item) for item in timer.reduce_plan]
            record["reduces"] = [[list(r) for r in st.reduces] for st in timer.steps]
            record["reduces_last_step_partial"] = (bool(timer.steps)
                                                   and len(timer.steps[-1].reduces) < len(timer.reduce_plan))
        path = Path(self.trace_dir) / f"pipeline_actions.{trace_file_stem(self.name)}.rank{ctx_rank()}.json"
        path.write_text(json.dumps(record))


def engine_stats(engine: Any) -> dict[str, Any]:
    """The caramel engine's stats for a bench record; with balance="dropout" also the drops in force
    at the end and when each began (the record's `dropout_fractions`, `dropout_changes`)."""
    out = dict(engine.stats_dict())
    balancer = getattr(engine.controller, "balancer", None)
    if hasattr(balancer, "fractions"):
        out["dropout_fractions"] = list(balancer.fractions)
        out["dropout_changes"] = [dict(c) for c in balancer.changes]  # copies: the balancer keeps appending
    return out


def _pipeline_runner(strategy: Strategy, model, optimizer, inputs, targets, loss_fn, ctx: StrategyContext) -> Runner:
    import caramel

    from caramel.bench.pipeline_plan import runtime_cluster

    try:
        options = strategy.spec().options
        # where ranks share a host: the speeds this pipeline's prediction settles at (every rank calls it)
        cluster = runtime_cluster(ctx.pipeline_profile, ctx.pipeline_cluster, options, ctx.process_group)
        pipe = caramel.pipeline(model, optimizer, options=options, process_group=ctx.process_group,
                                cluster=cluster, profile=ctx.pipeline_profile)
    except CaramelError as e:
        raise StrategyUnavailable(str(e)) from None
    # one rank's batch per position: a step trains as many samples as data parallelism does
    # (unequal or chosen replicas: the whole job is one pipeline, one rank's batch per worker)
    n = ctx.world_size if pipe.layout is None else len(pipe.layout.pipeline_ranks)
    runner = PipelineRunner(strategy.name, pipe, torch.cat([inputs] * n), torch.cat([targets] * n), loss_fn,
                            ctx.device, ctx.trace_dir)
    try:
        runner.prepare()
    except CaramelError as e:
        pipe.close()
        raise StrategyUnavailable(str(e)) from None
    return runner
