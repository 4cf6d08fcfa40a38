"""The one place where the training loop meets the strategy: `caramel.parallelize` with the
configured `NAME[:key=value,...]` (`caramel`, `ddp`, ...), and the process group it runs on.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import caramel
from caramel.train.config import TrainConfig

RANK_COMPRESSION_KEY = "caramel_compression_ranks"  # every rank's error feedback, in rank order
# the caramel engine's entries of a profiling or overlap trial taken half-way: a part per rank
PER_RANK_KEYS = ("profiling", "trial")
# ps stats_dict entries in the run summary: counted by a rank's own servers (summed for the job),
# and the rest each rank's own (updates applied, waits, the staleness of each forward)
PS_SUMMED_KEYS = ("lr_scaled", "dc_corrected", "dc_missing")
PS_PER_RANK_KEYS = ("updates_applied", "steps", "wait_s", "pace_wait_s", "staleness")


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def init_distributed(timeout_s: float) -> Dist:
    """Join (or create) the default process group from torchrun's environment (`caramel.init_distributed`:
    NCCL with CUDA, else gloo; one process without torchrun; a key prefix per torchrun restart)."""
    info = caramel.init_distributed(timeout_s=timeout_s)
    return Dist(info.rank, info.world_size, info.local_rank, torch.device(info.device))


def make_engine(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, trace_path: str | None,
                wl: Any, sampler: Any, start: int, saved: dict[str, Any] | None) -> Any:
    """`Parallel`, or for the pipeline strategy (which splits the model rather than wrapping
    it) `PipelineParallel`, built on the batch of step `start` (its cut may need a sample);
    `saved`: a resumed checkpoint's strategy entries."""
    from caramel.strategies import STRATEGIES

    spec = STRATEGIES.spec(cfg.parallel.strategy)
    if spec.info.name != "pipeline":
        return Parallel(model, optimizer, cfg, trace_path)
    from caramel.train.pipeline import PipelineParallel

    if cfg.optim.clip_grad_norm > 0:
        from caramel.errors import CaramelError
        raise CaramelError("strategy 'pipeline' does not clip gradients (the update runs inside the pipeline's step, "
                           "each stage on its own worker); set --clip-grad-norm 0")
    return PipelineParallel(wl.name, model, optimizer, spec.options, spec.name, sampler, start,
                            lambda idx: tuple(t.to(model_device(model)) for t in wl.train_set.batch(idx)), wl.loss_fn,
                            (saved or {}).get("pipeline"), trace_path)


class Parallel:
    """The wrapped model and optimizer plus the few strategy-specific calls the loop needs."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, trace_path: str | None):
        from caramel.strategies import STRATEGIES

        spec = STRATEGIES.spec(cfg.parallel.strategy)
        self.kind, self.strategy = spec.info.name, spec.name
        options = spec.options
        self.balance = getattr(spec.options, "balance", "off")  # "batch": the loop draws batches by share
        if self.kind == "ps" and cfg.optim.clip_grad_norm > 0:
            # the gradients leave for the servers as backward makes them: the servers clip them
            if options.clip_grad_norm not in (0.0, cfg.optim.clip_grad_norm):
                from caramel.errors import CaramelError
                raise CaramelError(f"--clip-grad-norm {cfg.optim.clip_grad_norm:g} and the strategy's clip_grad_norm="
                                   f"{options.clip_grad_norm:g} differ; give one")
            options = dataclasses.replace(options, clip_grad_norm=cfg.optim.clip_grad_norm)
        if self.kind == "ps" and (spec.options.dedicated or os.environ.get("CARAMEL_PS_SERVERS", "0").strip() not in ("", "0")):
            from caramel.errors import CaramelError
            raise CaramelError("caramel train does not run dedicated ps servers yet (its data shards, validation and "
                               "checkpoints span every rank); drop dedicated=true / CARAMEL_PS_SERVERS, or run your "
                               "own script with `caramel cluster run --ps-servers N`")
        if self.kind == "gossip":
            options = gossip_options_for_clipping(options, cfg.optim.clip_grad_norm)
        # gossip cross_term=halves: each step's batch in two halves, one backward each
        self.halves = self.kind == "gossip" and options.halves
        if self.halves and cfg.data.batch_size % 2:
            from caramel.errors import CaramelError
            raise CaramelError(f"strategy 'gossip': cross_term=halves splits each worker's batch into two equal "
                               f"halves; --batch-size {cfg.data.batch_size} is odd (give an even one)")
        extra: dict[str, Any] = {}
        if self.kind in ("gossip", "ps"):
            # per rank: trace.rank<r>.json (gossip: consensus and bytes per step; ps: its stats_dict and per-step log)
            extra["trace"] = trace_path
        if self.kind == "caramel":
            extra["trace"] = trace_path
            if cfg.parallel.bandwidth and cfg.parallel.cluster != "off":
                # plan for the link the emulated cluster shapes, not the default assumption
                from caramel.topology.spec import ClusterSpec
                from caramel.units import parse_rate_bps
                extra["cluster"] = ClusterSpec.uniform(dist.get_world_size(), parse_rate_bps(cfg.parallel.bandwidth))
        self.model, self.optimizer = caramel.parallelize(model, optimizer, options=options, strategy=self.kind,
                                                         **extra)

    def batch_indices(self, sampler: Any, step: int) -> torch.Tensor:
        """This rank's samples at `step` (its own shard)."""
        return sampler.indices(step)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Any, clip_grad_norm: float) -> torch.Tensor:
        """Forward, backward, (clipping,) the update: the loss of this rank's batch."""
        if self.halves:
            loss = self._halves_backward(x, y, loss_fn)
        else:
            loss = loss_fn(self.model(x), y)
            loss.backward()
        if clip_grad_norm > 0:
            self.clip_grad_norm_(clip_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _halves_backward(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        """gossip cross_term=halves: forward and backward of each half of the batch, each loss
        (a mean) halved, so p.grad ends as the whole batch's mean-loss gradient; the strategy
        keeps what the first backward added. Returns the batch's loss."""
        half = x.shape[0] // 2
        if x.shape[0] % 2:
            from caramel.errors import CaramelError
            raise CaramelError(f"strategy 'gossip': cross_term=halves splits each batch into two equal halves; this "
                               f"batch has {x.shape[0]} samples (an odd last batch: use an even --batch-size and "
                               "drop the remainder)")
        losses = []
        for part in (slice(0, half), slice(half, None)):
            loss = loss_fn(self.model(x[part]), y[part])
            (loss / 2).backward()
            losses.append(loss.detach())
        return (losses[0] + losses[1]) / 2

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer state a checkpoint holds (all ranks call it). Under caramel the parts
        each rank holds for itself (error feedback, the balancers' windows, what profiling or an
        overlap trial measured so far) are gathered from every rank: the checkpoint is written by rank 0 alone."""
        state = self.optimizer.state_dict()
        if self.kind == "caramel" and dist.is_initialized() and dist.get_world_size() > 1:
            from caramel.runtime.optimizer import ADAPTIVE_STATE_KEY, COMPRESSION_STATE_KEY
            from caramel.strategies.caramel.balance_state import merge_rank_states

            # on the host: rank 0 unpickles every rank's tensors, which must not land on their GPUs;
            # of the profiling's and the trial's entries only each rank's part (the rest is alike)
            adaptive = state.get(ADAPTIVE_STATE_KEY) or {}
            halfway = [k for k in PER_RANK_KEYS if isinstance(adaptive.get(k), dict)]
            mine = _on_cpu((state.get(COMPRESSION_STATE_KEY), adaptive.get("balance"),
                            {k: adaptive[k].get("ranks") for k in halfway}))
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            if any(codec for codec, _, _ in everyone):
                state[RANK_COMPRESSION_KEY] = [codec or {} for codec, _, _ in everyone]
            balance = merge_rank_states([b for _, b, _ in everyone])
            if balance is not None:
                state[ADAPTIVE_STATE_KEY] = {**state[ADAPTIVE_STATE_KEY], "balance": balance}
            for k in halfway:
                ranks = {r: own for _, _, parts in everyone for r, own in ((parts or {}).get(k) or {}).items()}
                state[ADAPTIVE_STATE_KEY] = {**state[ADAPTIVE_STATE_KEY], k: {**adaptive[k], "ranks": ranks}}
        return state

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        per_rank = state.pop(RANK_COMPRESSION_KEY, None)
        if per_rank is not None:  # this rank's own error feedback, not rank 0's
            from caramel.runtime.optimizer import COMPRESSION_STATE_KEY
            state[COMPRESSION_STATE_KEY] = per_rank[dist.get_rank()]
        self.optimizer.load_state_dict(state)

    def checkpoint_extra(self) -> dict[str, Any]:
        """Strategy-specific entries of a checkpoint (none here)."""
        return {}

    @property
    def module(self) -> nn.Module:
        """The user's model, unwrapped (for evaluation and checkpoints, after `synchronize`)."""
        return self.model.module

    def synchronize(self) -> None:
        """Apply every pending update (Caramel may defer them; DDP has none)."""
        self.optimizer.synchronize()

    def eval_module(self) -> nn.Module:
        """The model to evaluate and checkpoint: the user's model, or under gossip (where every
        worker's differs) the workers' average (all ranks must call it)."""
        if self.kind == "gossip":
            return self.optimizer.gossip.averaged_module()
        return self.module

    def worker_states(self) -> list[Any] | None:
        """Under gossip, every worker's own state (all ranks call; rank order), else None."""
        if self.kind != "gossip":
            return None
        states: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(states, self.optimizer.gossip.worker_state())
        return states

    def load_worker_state(self, state: dict[str, Any], rank: int) -> None:
        """Resume this worker's own gossip state from a checkpoint's `gossip_workers`."""
        if self.kind == "gossip" and state.get("gossip_workers"):
            self.optimizer.gossip.load_worker_state(state["gossip_workers"][rank])

    def clip_grad_norm_(self, max_norm: float) -> None:
        """Clip the global gradient norm; Caramel must first finish every reduction (it synchronizes)."""
        if self.kind == "caramel":
            caramel.clip_grad_norm_(self.optimizer, max_norm)
        elif self.kind == "ps":
            pass  # the servers clip the averaged gradient before they apply it (clip_grad_norm in the options)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def stats(self) -> dict[str, Any]:
        """The engine's per-step statistics (exposed communication etc.); empty for DDP."""
        engine = (getattr(self.optimizer, "engine", None) or getattr(self.optimizer, "ps", None)
                  or getattr(self.optimizer, "gossip", None))
        return dict(engine.stats_dict()) if engine is not None else {}


    def ps_summary(self) -> dict[str, Any] | None:
        """Under ps, what the servers did, for the run summary (all ranks call; the same dict on
        each): the counters of a rank's own servers summed over the ranks (each counts its shard
        only), the rest per rank in rank order (staleness: [step, lag] of each forward after
        profiling). None for the other strategies."""
        if self.kind != "ps":
            return None
        s = self.stats()
        mine = {k: s.get(k) for k in (*PS_SUMMED_KEYS, *PS_PER_RANK_KEYS)}
        # the lag of each forward the engine logged (the profiling steps' are not), with its step
        mine["staleness"] = [[x["step"], x["staleness"]] for x in self.optimizer.ps.log]
        everyone: list[Any] = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        return {"consistency": s.get("consistency"), "order": s.get("order"),
                **{k: sum(r[k] or 0 for r in everyone) for k in PS_SUMMED_KEYS},
                **{f"{k}_per_rank": [r[k] for r in everyone] for k in PS_PER_RANK_KEYS}}


def model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _on_cpu(obj: Any) -> Any:
    """`obj` with every tensor in it copied to the host (dicts, lists and tuples walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def gossip_options_for_clipping(options: Any, clip_grad_norm: float) -> Any:
    """Gossip tracking's trackers formed at step() when the loop clips: overlapped, they would
    leave in backward, before the clipping (and step() refuses the changed gradients). Only
    the default moves; an explicit overlap_trackers=true with clipping is an error."""
    if clip_grad_norm > 0 and options.tracks and options.overlap_trackers is None:
        return dataclasses.replace(options, overlap_trackers=False)
    if clip_grad_norm > 0 and options.tracks and options.overlap_trackers:
        from caramel.errors import CaramelError
        raise CaramelError(f"--clip-grad-norm {clip_grad_norm:g} clips the gradients after backward, and "
                           f"overlap_trackers=true sends algorithm={options.algorithm}'s trackers during backward, "
                           "before the clipping; drop overlap_trackers=true (caramel train then forms them at "
                           "step()) or --clip-grad-norm")
    return options
