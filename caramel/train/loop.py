"""The training loop that every rank runs: data shard, engine, validation, checkpoints, metrics.

Resuming is exact: the data position is the step count (see `ShardedSampler`), and model,
optimizer, LR schedule and every rank's RNG states come back from the checkpoint, so a resumed
run produces the same losses, bit for bit, as one that was never interrupted. With `--data URL`
the batches come from the store through `caramel.data`'s loader (`store_data.StoreBatches`),
whose state (every rank's) is in the checkpoint too.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.train import checkpoint as ckpt
from caramel.train.config import TrainConfig
from caramel.train.data import ShardedSampler, val_shard
from caramel.train.store_data import StoreBatches, check_store, clear_default_cache
from caramel.train.strategy import Dist, Parallel, init_distributed, make_engine
from caramel.train.uneven import BatchSource, emulate_slow_worker
from caramel.train.report import Progress, format_summary, simulated_speedup_vs_ddp
from caramel.train.workloads import TrainWorkload, build_workload

VAL_MAX_SAMPLES = 1024  # validation reads at most this many samples, so it stays a small fraction of a run
CRASH_ENV = "CARAMEL_TRAIN_CRASH_AT_STEP"  # fault injection for restart tests: "STEP" or "STEP:RANK"


def make_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.optimizer == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """LR multiplier at `step`: linear warm-up, then cosine decay to `min_lr_ratio` (or constant)."""
    o, total = cfg.optim, cfg.run.steps
    if step < o.warmup_steps:
        return (step + 1) / o.warmup_steps
    if o.schedule == "constant" or total <= o.warmup_steps:
        return 1.0
    progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def evaluate(engine: Parallel, wl: TrainWorkload, d: Dist, batch_size: int) -> dict[str, float]:
    """Validation loss and top-1 accuracy over every rank's validation shard (one all-reduce)."""
    engine.synchronize()
    module = engine.eval_module()
    was_training = module.training
    module.eval()
    n = min(len(wl.val_set), VAL_MAX_SAMPLES)
    sums = torch.zeros(3, dtype=torch.float64)  # loss x predictions, correct, predictions
    with torch.no_grad():
        for idx in val_shard(n, d.world_size, d.rank).split(batch_size * 4):
            x, y = (t.to(d.device) for t in wl.val_set.batch(idx))
            logits = module(x)
            sums += torch.tensor([float(wl.loss_fn(logits, y)) * y.numel(), wl.correct(logits, y), y.numel()], dtype=torch.float64)
    module.train(was_training)
    dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    return {"val_loss": loss_sum / count, "val_accuracy": correct / count, "val_predictions": int(count)}


def save_checkpoint(engine: Parallel, scheduler, cfg: TrainConfig, d: Dist, sampler: ShardedSampler, step: int,
                    store: StoreBatches | None = None) -> Path | None:
    """All ranks: apply pending updates, gather RNG states (and loader states); rank 0 writes; everyone waits for the write."""
    engine.synchronize()
    rngs: list[Any] = [None] * d.world_size
    dist.all_gather_object(rngs, ckpt.rng_state())
    loaders: list[Any] = [None] * d.world_size
    if store is not None:
        dist.all_gather_object(loaders, store.state_dict())
    workers = engine.worker_states()  # gossip: every worker's own model and optimizer
    optimizer_state = engine.optimizer_state()  # pipeline: gathered from the stages' owners
    extra = engine.checkpoint_extra()  # pipeline: its cut, so a resumed run cuts alike
    model = engine.eval_module() if workers is not None else engine.module
    path = None
    if d.rank == 0:
        epoch, index = sampler.position(step)
        state = {
            "step": step, "epoch": epoch, "index": index,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "rng": rngs,
            "config": cfg.to_dict(),
            **extra,
        }
        if workers is not None:
            state["gossip_workers"] = workers
        if store is not None:
            state["data_loader"] = loaders
        path = ckpt.save(cfg.checkpoint_dir(), step, state, d.world_size, cfg.checkpoint.keep_last)
    dist.barrier()
    return path


def resolve_resume(cfg: TrainConfig, d: Dist) -> tuple[str | None, dict | None]:
    """Rank 0 decides which checkpoint to resume from (or clears old ones on a fresh start); all ranks load it.

    A torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) always resumes from the newest valid
    checkpoint. Errors are broadcast so that every rank raises the same one instead of hanging.
    """
    mode = cfg.checkpoint.resume
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        mode = "auto"
    decision: list[Any] = [None, None, 0]  # path, error, removed
    if d.rank == 0:
        try:
            if mode == "none":
                decision[2] = ckpt.remove_all(cfg.checkpoint_dir())
            elif mode == "auto":
                found = ckpt.latest_valid(cfg.checkpoint_dir())
                decision[0] = str(found[0]) if found else None
            else:
                ckpt.load(mode)
                decision[0] = mode
        except CaramelError as e:
            decision[1] = str(e)
    dist.broadcast_object_list(decision, src=0)
    path, error, removed = decision
    if error:
        raise CaramelError(error)
    if d.rank == 0 and removed:
        print(f"fresh start (--resume none): removed {removed} old checkpoint(s) from {cfg.checkpoint_dir()}")
    if path is None:
        return None, None
    try:
        state = ckpt.load(path)
    except CaramelError as e:
        raise CaramelError(f"{e} (rank {d.rank}; the checkpoint directory must be on a filesystem every worker can read)") from None
    return path, state


def _maybe_crash(step: int, rank: int) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    at, _, on_rank = spec.partition(":")
    if step == int(at) and rank == int(on_rank or 0):
        print(f"rank {rank}: {CRASH_ENV}={spec}: exiting at step {step} to test restarts", flush=True)
        os._exit(17)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train on this process's rank; returns the summary (the same dict on every rank)."""
    d = init_distributed(cfg.parallel.timeout_s)
    main = d.rank == 0
    out_dir = Path(cfg.run.out_dir)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"caramel train: rank 0 of {d.world_size} on {d.device}; effective config:\n{cfg.describe()}", flush=True)
    wl = build_workload(cfg)
    model = wl.model.to(d.device)
    n_train = check_store(cfg, len(wl.train_set)) if cfg.data.url else len(wl.train_set)
    sampler = ShardedSampler(n_train, d.world_size, d.rank, cfg.data.batch_size, cfg.run.seed,
                             cfg.data.shuffle, cfg.data.remainder)
    optimizer = make_optimizer(cfg, model)
    resumed_from, state = resolve_resume(cfg, d)
    store = None
    if cfg.data.url:
        if state is None and clear_default_cache(cfg, d.rank) and main:
            print(f"fresh start: emptied the shard cache {Path(cfg.run.out_dir) / 'data-cache'} of earlier runs", flush=True)
        store = StoreBatches(cfg, sampler, d.rank, d.world_size)
    data_desc = store.describe() if store is not None else sampler.describe()
    if state is not None:
        ckpt.check_compatible(state, cfg.to_dict(), d.world_size, model, resumed_from)
        model.load_state_dict(state["model"])
    slow = None
    if cfg.parallel.slow_worker:  # calibrated on a batch of the training split (a store holds the same samples)
        x0, y0 = (t.to(d.device) for t in wl.train_set.batch(sampler.indices(0)))
        slow = emulate_slow_worker(cfg.parallel.slow_worker, d.rank, d.world_size, model, x0, y0, wl.loss_fn)
    trace_path = str(out_dir / "trace.json")
    engine = make_engine(model, optimizer, cfg, trace_path, wl, sampler, state["step"] if state is not None else 0, state)
    balance = getattr(engine, "balance", "off")
    balanced = balance == "batch"
    batches = BatchSource(sampler, engine.optimizer, balance, d.world_size * cfg.data.batch_size,
                          len(wl.train_set), cfg.run.seed)
    scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda s: lr_factor(cfg, s))
    start = 0
    if state is not None:
        try:
            engine.load_optimizer_state(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError) as e:
            raise CaramelError(f"checkpoint {resumed_from}: optimizer state does not fit this model ({e})") from None
        engine.load_worker_state(state, d.rank)
        if store is not None:
            if "data_loader" not in state:
                raise CaramelError(f"checkpoint {resumed_from} holds no data loader state for --data")
            store.load_state_dict(state["data_loader"][d.rank])
        ckpt.set_rng_state(state["rng"][d.rank])
        start = state["step"]
    else:
        torch.manual_seed(cfg.run.seed * 1000 + d.rank + 1)  # dropout differs per rank, reproducibly
    del state

    metrics_path = out_dir / "metrics.jsonl"
    if main:
        _truncate_metrics(metrics_path, start)
        params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        source = f" from {cfg.data.url} ({cfg.data.data_order} order)" if store is not None else ""
        print(f"workload {wl.name}: {params:,} parameters; train {n_train}{source} / val {len(wl.val_set)} {wl.sample_unit}; "
              f"{d.world_size} workers x {cfg.data.batch_size}; {data_desc}"
              + (f"; resuming from {resumed_from} (step {start})" if resumed_from else ""), flush=True)

    total = cfg.run.steps
    stop_at = min(total, cfg.run.stop_after_steps) if cfg.run.stop_after_steps else total
    history: list[dict[str, Any]] = []
    last_val: dict[str, float] = {}
    last_ckpt: Path | None = None
    samples_per_step = d.world_size * cfg.data.batch_size
    progress = Progress(total, start, enabled=main)
    metrics = open(metrics_path, "a") if main else None
    t_run = time.perf_counter()
    try:
        for step in range(start, stop_at):
            t0 = time.perf_counter()
            if store is not None:
                x, y = (t.to(d.device) for t in store.batch(step))
            else:
                idx = batches.indices(step) if balanced else engine.batch_indices(sampler, step)
                x, y = (t.to(d.device) for t in wl.train_set.batch(idx))
            # pipeline: the loss of its whole batch, on every rank (not only the last stage's)
            loss = engine.train_step(x, y, wl.loss_fn, cfg.optim.clip_grad_norm)
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            loss_value = loss.item()
            step_s = time.perf_counter() - t0
            done = step + 1
            wait = engine.stats().get("last_wait_s")
            epoch, _ = sampler.position(step)
            row = {"kind": "train", "step": done, "epoch": epoch, "loss": loss_value, "lr": lr, "step_time_s": step_s,
                   "samples_per_s": samples_per_step / step_s, "exposed_comm_s": wait, "time": time.time()}
            history.append(row)
            if metrics:
                metrics.write(json.dumps(row) + "\n")
            progress.update(row, refresh=done % cfg.run.log_every_steps == 0 or done == stop_at)
            _maybe_crash(done, d.rank)
            if cfg.run.val_every_steps and done % cfg.run.val_every_steps == 0 and done < total:
                last_val = evaluate(engine, wl, d, cfg.data.batch_size)
                _write_val(metrics, progress, done, last_val)
            if (cfg.checkpoint.every_steps and done % cfg.checkpoint.every_steps == 0) or done == stop_at:
                if metrics:
                    metrics.flush()
                last_ckpt = save_checkpoint(engine, scheduler, cfg, d, sampler, done, store)
        finished = stop_at == total
        if finished:
            last_val = evaluate(engine, wl, d, cfg.data.batch_size)
            _write_val(metrics, progress, total, last_val)
        engine.synchronize()
    finally:
        progress.close()
        if metrics:
            metrics.close()
        if store is not None:
            store.close()
    wall_s = time.perf_counter() - t_run
    trace_file = _merge_traces(engine, d, out_dir) if engine.kind in ("caramel", "pipeline") else None
    if engine.kind == "ps":  # per rank, written at synchronize; not merged (its meta is the rank's own)
        trace_file = str(out_dir / ("trace.json" if d.world_size == 1 else "trace.rank*.json"))
    summary = _summary(cfg, d, wl, data_desc, engine, history, last_val, start, stop_at, wall_s, resumed_from, last_ckpt, metrics_path, trace_file)
    summary.update(batches.summary(), **({"slow_worker": slow} if slow else {}))
    if main:
        from caramel.jsonio import write_json
        write_json(out_dir / "summary.json", summary)
        print(format_summary(summary), flush=True)
    return summary


def _write_val(metrics, progress, step: int, val: dict[str, float]) -> None:
    progress.write(f"step {step}: validation loss {val['val_loss']:.4f}, accuracy {100 * val['val_accuracy']:.1f}%")
    if metrics:
        metrics.write(json.dumps({"kind": "val", "step": step, **val, "time": time.time()}) + "\n")


def _truncate_metrics(path: Path, start: int) -> None:
    """Drop metric lines past the resume point (a crashed run may have logged steps it never checkpointed)."""
    if start == 0 or not path.exists():
        path.unlink(missing_ok=True)
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= start:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
    path.write_text("".join(k + "\n" for k in keep))


def _merge_traces(engine: Parallel, d: Dist, out_dir: Path) -> str | None:
    """Rank 0 merges the per-rank traces (written at synchronize) into one timeline file."""
    dist.barrier()  # every rank's trace file is on disk
    if d.world_size == 1:
        return str(out_dir / "trace.json")
    merged = out_dir / "trace.merged.json"
    if d.rank == 0:
        try:
            from caramel.trace.load import load_traces
            load_traces([out_dir / f"trace.rank{r}.json" for r in range(d.world_size)]).save(merged)
        except (ImportError, CaramelError) as e:  # the run itself succeeded; say why there is no merged file
            print(f"note: per-rank traces not merged ({e}); they are {out_dir}/trace.rank*.json", flush=True)
            return str(out_dir / "trace.rank*.json")
    return str(merged)


def _summary(cfg, d, wl, data_desc, engine, history, val, start, stop_at, wall_s, resumed_from, last_ckpt, metrics_path,
             trace_file) -> dict[str, Any]:
    steady = [r["step_time_s"] for r in history[min(len(history) - 1, 5):]] if history else []  # skip warm-up steps
    step_s = statistics.median(steady) if steady else None
    waits = [r["exposed_comm_s"] for r in history[5:] if r["exposed_comm_s"] is not None]
    tail = [r["loss"] for r in history[-10:]]
    stats = engine.stats()
    summary = {
        "format": "caramel.train-summary/1",
        "workload": wl.name, "world_size": d.world_size, "batch_size_per_worker": cfg.data.batch_size,
        "strategy": engine.strategy,
        "planner": stats.get("planner"),
        "overlap": stats.get("overlap"),
        "start_step": start, "end_step": stop_at, "total_steps": cfg.run.steps, "finished": stop_at == cfg.run.steps,
        "resumed_from": resumed_from, "last_checkpoint": str(last_ckpt) if last_ckpt else None,
        "data": data_desc, "remainder": cfg.data.remainder,
        "data_store": {"url": cfg.data.url, "order": cfg.data.data_order, "loader_workers": cfg.data.loader_workers}
        if cfg.data.url else None,
        "first_loss": history[0]["loss"] if history else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "losses_averaged": len(tail),
        **val,
        "median_step_time_s": step_s,
        "samples_per_s": d.world_size * cfg.data.batch_size / step_s if step_s else None,
        "exposed_comm_s": statistics.median(waits) if waits else None,
        "bytes_per_step": stats.get("bytes_per_step"),
        "bubble_fraction": stats.get("bubble_fraction"),  # pipeline: measured idle share of the step
        "pipeline": {k: stats[k] for k in ("boundaries", "microbatches", "bubble_fraction_per_stage",
                                           "bubble_fraction_ideal") if k in stats} or None,
        # ps ssp/asp: how many updates rank 0's parameters lagged, averaged over its forwards
        "staleness_mean": statistics.mean(stats["staleness"]) if stats.get("staleness") else None,
        # ps: what the servers did (lr_scaled, updates_applied, dc_corrected, staleness per step)
        "ps": engine.ps_summary() if engine.kind == "ps" else None,
        "consensus_distance": stats.get("consensus_last"),  # gossip: the workers' last measured disagreement
        "overlap_trial": stats.get("overlap_trial"),
        "delegated_to_ddp": bool(stats.get("delegated_to_ddp")),
        "wall_s": wall_s,
        "metrics": str(metrics_path),
        "trace": trace_file,
        "workload_info": wl.info,
    }
    summary["sim_speedup_vs_ddp"] = simulated_speedup_vs_ddp(cfg, summary, engine)
    return summary
