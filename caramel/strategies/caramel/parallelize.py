"""`parallelize(model, optimizer)` for the caramel strategy: input checks and set-up.

Order at start-up (every rank): check that all ranks hold the same model (one all-gather of a
small signature; a mismatch is an error on every rank, never a hang), broadcast parameters
and buffers from rank 0, create the engine's private communication groups (gloo for CPU
tensors, NCCL for CUDA tensors: `caramel.distributed.comm_group_for`), then hand the engine to
its controller (`controller`), which takes the given plan (or plans from the given profile on
rank 0 and broadcasts it), or runs a short online profiling phase inside the user's own first
steps and switches to the real plan at the same step on every rank.
"""
from __future__ import annotations

import atexit
import json
import os
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import comm_group_for, init_distributed, params_device, resolve_timeout_s
from caramel.errors import CaramelError, MismatchError
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile, model_fingerprint
from caramel.profile.profiler import dtype_name, unique_params
from caramel.profile.tied import find_tied_embeddings
from caramel.runtime.buffer_sync import BufferSync, buffer_mode
from caramel.runtime.comm_priority import CommPriority
from caramel.runtime.dispatch import RELEASED, LocalGroup
from caramel.runtime.engine import Engine
from caramel.runtime.model import CaramelModel
from caramel.runtime.optimizer import steps_per_parameter, wrap_optimizer
from caramel.strategies.caramel.adaptive_compression import with_codecs
from caramel.strategies.caramel.balance import Balancer
from caramel.strategies.caramel.controller import Controller
from caramel.strategies.caramel.dropout import DropoutBalancer, load_table
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.caramel.plan_state import plan_inputs
from caramel.strategies.caramel.trial import AUTO_CANDIDATES, Candidate
from caramel.strategies.session import Session
from caramel.topology.spec import ClusterSpec
from caramel.trace.recorder import Recorder
from caramel.trace.windows import window_meta


def parallelize_caramel(model: nn.Module, optimizer: torch.optim.Optimizer, options: CaramelOptions, *,
                        process_group: Any = None, broadcast_buffers: bool | str = True,
                        find_unused_parameters: bool | None = None, plan: Plan | str | os.PathLike | None = None,
                        profile: ModelProfile | str | os.PathLike | None = None, cluster: ClusterSpec | None = None,
                        trace: str | os.PathLike | None = None, timeout_s: float | None = None,
                        session: Session | None = None,
                        optimizer_holds_more: bool = False) -> tuple[CaramelModel, torch.optim.Optimizer]:
    """Wrap `model` and `optimizer` for data-parallel training with Caramel's engine.

    Returns `(model, optimizer)`: a DDP-like wrapper module and the same optimizer object,
    whose `step()` may defer updates to the next forward (`overlap="forward"`), and whose
    `synchronize()` applies every pending update. `overlap="auto"` (the default) times the
    planner's "forward" and "backward" plans and DDP's schedule for a few steps each after
    planning and keeps the fastest (`caramel.strategies.caramel.trial`). `session` names the
    engine's private groups and releases them at shutdown (`caramel.strategies.session`).
    `optimizer_holds_more`: the optimizer may also hold parameters of other modules (a pipeline
    stage's part of the whole model's optimizer); the engine reduces and applies `model`'s only.
    """
    if session is None:
        raise CaramelError("parallelize_caramel needs the session that owns its engine; "
                           "call caramel.parallelize, which passes the process's default one")
    planner, overlap = options.planner, options.overlap
    trial_steps, trial_passes = options.trial_steps, options.trial_passes
    comm_priority, split_tied = options.comm_priority, options.split_tied
    early_weight_grad = options.early_weight_grad
    profile_steps, check_every, replan = options.profile_steps, options.check_every, options.replan
    planner_options = options.planner_options()
    compression, balance, balance_every = options.compression, options.balance, options.balance_every
    if balance in ("batch", "dropout"):
        # a tied embedding's rows travel apart, weighted 1 / world size: not by share nor by unit
        split_tied = False
    # the narrow forwards call deferred and early weight gradients' split ones (dropout_groups)
    dropout = load_table(options.dropout_table, model) if balance == "dropout" else None
    find_unused_parameters = True if find_unused_parameters is None else find_unused_parameters
    if not isinstance(model, nn.Module):
        raise CaramelError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise CaramelError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(model, CaramelModel) or hasattr(optimizer, "_caramel_engine"):
        raise CaramelError("model or optimizer is already parallelized")
    buffers = buffer_mode(broadcast_buffers)
    if not isinstance(find_unused_parameters, bool):
        raise CaramelError(f"find_unused_parameters must be True or False, got {find_unused_parameters!r}")
    # every check that can fail runs before anything is created or changed, so that bad input
    # leaves nothing behind (a default process group made here is destroyed again); with
    # several ranks, what one rank finds wrong is raised on every rank after one all-gather
    names, params = unique_params(model)
    if not optimizer_holds_more:
        _check_optimizer_params(optimizer, params)
    signature = [(n, list(p.shape), dtype_name(p.dtype), p.requires_grad) for n, p in zip(names, params)]
    fingerprint = model_fingerprint(signature)
    made_default_group = not dist.is_initialized()
    if made_default_group:
        init_distributed(timeout_s=timeout_s)
    try:
        group = process_group or dist.group.WORLD
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        input_error = None
        try:
            plan = _load(plan, Plan) if plan is not None else None
            profile = _load(profile, ModelProfile) if profile is not None and plan is None else None
            if world > 1:
                _check_inputs_match(plan, profile, names, fingerprint, world)
        except CaramelError as e:
            if world == 1:
                raise
            input_error, plan, profile = str(e), None, None
        # one process has no communication threads: nothing to raise, nothing to refuse
        prio = CommPriority.resolve(comm_priority if world > 1 else "normal")
        if comm_priority == "realtime" and prio.reason is not None and input_error is None:
            input_error = (f"comm_priority='realtime': {prio.reason}; pass comm_priority='auto' to fall back to "
                           "normal priority")
        # planner options are not compared: only rank 0 plans
        options = {"planner": planner, "overlap": overlap, "split_tied": split_tied,
                   "early_weight_grad": early_weight_grad, "broadcast_buffers": broadcast_buffers,
                   "find_unused_parameters": find_unused_parameters, "profile_steps": profile_steps,
                   "check_every": check_every, "replan": replan, "trial_steps": trial_steps, "trial_passes": trial_passes,
                   "comm_priority": comm_priority, "compression": compression, "balance": balance, "balance_every": balance_every,
                   "dropout_table": json.dumps(dropout[0].to_dict(), sort_keys=True) if dropout else None,
                   "plan": plan.fingerprint if plan is not None else None, "profile given": profile is not None,
                   "cluster": json.dumps(cluster.to_dict(), sort_keys=True, default=str) if cluster is not None else None}
        _check_same_model(signature, fingerprint, group, rank, world, options, input_error)
    except BaseException:
        if made_default_group:
            dist.destroy_process_group()
        raise
    _broadcast_state(model, group, world)
    device = params_device(params) if params else torch.device("cpu")
    timeout_s = resolve_timeout_s(timeout_s)
    names_from = session.group_prefix(group, fingerprint) if world > 1 else None

    def private_group(kind: str):
        return comm_group_for(device, group, f"{kind}-{names_from}", priority=prio, timeout_s=timeout_s)

    comm = private_group("grad") if world > 1 else LocalGroup()
    trace_path = _trace_path(trace, rank, world)
    recorder = Recorder(rank, world, enabled=trace_path is not None)
    lazy_ok = steps_per_parameter(optimizer)
    auto = overlap == "auto"
    if auto and not lazy_ok:
        auto, overlap = False, "backward"  # updates cannot be split per bucket: nothing to try
    engine = Engine(model, optimizer, params, names, comm, world, rank, AUTO_CANDIDATES[0] if auto else overlap,
                    recorder, timeout_s, comm_priority=prio if world > 1 else None)
    engine.early_weight_grads = early_weight_grad
    wrap_optimizer(optimizer, engine)
    controller = Controller(engine, model, names, params, group, rank, world, planner, cluster, planner_options,
                            fingerprint, lazy_ok, profile_steps, check_every, replan,
                            trial_steps=trial_steps if auto else 0, broadcast_buffers=buffers is not None,
                            trial_passes=trial_passes, find_unused_parameters=find_unused_parameters,
                            comm_priority=prio, compression=compression,
                            plan_inputs=plan_inputs(planner=planner, planner_options=planner_options, overlap=overlap,
                                                    compression=compression, split_tied=split_tied, balance=balance,
                                                    cluster=cluster, plan=plan, profile=profile))
    if balance == "batch":
        controller.balancer = Balancer(engine, model, group, rank, world, balance_every)
        controller.handover.weight_shares = True
    elif dropout is not None and world > 1:
        controller.balancer = DropoutBalancer(engine, model, group, rank, world, balance_every, *dropout)
    tied = find_tied_embeddings(model, params) if world > 1 and split_tied else []
    if tied:  # before any plan or profile, which see the split
        engine.split_tied(tied, private_group("rows"))
    if world == 1:
        if recorder.enabled:
            engine.install_forward_hooks()  # passthrough: no plan; forward events for the trace
    elif plan is not None:
        if compression not in ("none", "auto"):
            # a fixed codec applies to a given plan too (auto needs a profile to simulate; a
            # given plan keeps the codecs it carries)
            plan = with_codecs(plan, [compression] * len(plan.buckets))
        modes = AUTO_CANDIDATES if auto else (overlap,)
        controller.adopt_or_try([Candidate(f"plan/{m}", m, plan) for m in modes], source="plan", planner="plan")
    elif profile is not None:
        controller.plan_from_profile(profile)
    else:
        controller.start_profiling()
    if buffers and world > 1 and any(True for _ in model.buffers()):
        sync = BufferSync(model, engine, private_group("buf"), mode=buffers, device=device)
        engine.hold_group(sync)
        # first of the model's pre-hooks, as DDP broadcasts before the module runs: the broadcast
        # waits for the slowest peer, which is communication, not forward time, so the online
        # profile's forward and the trace's compute leave it out (the simulator does not model
        # it; the trace shows it as a wait just before the forward, at the end of the previous
        # step's window)
        engine.remove_at_release(model.register_forward_pre_hook(sync.pre_forward, prepend=True),
                                 model.register_forward_hook(sync.post_forward, always_call=True))
    wrapped = CaramelModel(model, engine)
    session.register(engine)
    if trace_path is not None:
        _save_at_exit(engine, trace_path)
    return wrapped, optimizer


def mute_gradient_communication(optimizer: torch.optim.Optimizer) -> None:
    """Headroom analysis, the engine's twin of torch DDP's `noop_hook`: from now on every gradient
    collective of the engine behind `optimizer` is a no-op, so each rank updates with its own
    gradients, pre-divided by the world size as always, while the hooks, bucket copies, buffer
    broadcasts and lazy updates run as usual.

    For timing what the engine costs besides the network (`experiments.validation.calibrate`);
    never for training. Refused while online profiling or the overlap trial runs (they choose
    from timed collectives; `schedule_settled` tells when they are over). Pending collectives
    finish first. The schedule in force then stays (no re-profile, no re-plan). Irreversible
    for this engine.
    """
    engine = getattr(optimizer, "_caramel_engine", None)
    if engine is None:
        raise CaramelError("mute_gradient_communication: the optimizer is not one that caramel.parallelize returned")
    if engine.comm is None:
        raise CaramelError(RELEASED)
    engine.controller.mute()


def _check_optimizer_params(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    ids = {id(p) for p in params}
    for gi, g in enumerate(optimizer.param_groups):
        for p in g["params"]:
            if id(p) not in ids:
                raise CaramelError(f"optimizer param_groups[{gi}] holds a tensor of shape {tuple(p.shape)} that is not a parameter of the model")


def _check_inputs_match(plan: Plan | None, profile: ModelProfile | None, names: list[str], fingerprint: str,
                        world: int) -> None:
    """A given plan or profile is for this model (and a plan for this many workers)."""
    if plan is not None:
        plan.check_model(fingerprint, names, source="plan")
        if plan.world_size != world:
            raise MismatchError(f"plan: plan was made for {plan.world_size} workers, this job has {world}")
    if profile is not None and profile.fingerprint() != fingerprint:
        raise MismatchError(f"profile of model {profile.model!r} does not match this model's parameters "
                            f"(profile has {len(profile.params)} parameters, model has {len(names)})")


def _check_same_model(signature, fingerprint: str, group, rank: int, world: int, options: dict[str, Any],
                      input_error: str | None = None) -> None:
    """Every rank holds the same model, passed the same options to `parallelize`, and found its
    plan or profile fit for it (`input_error`: what `_check_inputs_match` said on this rank). One
    all-gather: a mismatch on any rank is the same error on every rank, never a hang or a silent mix."""
    if world == 1:
        return
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (fingerprint, signature, options, input_error), group=group)
    # the models first, then each rank's plan or profile, then the options: the first
    # difference found is the cause the message names
    _check_same_signature([(fp, sig) for fp, sig, _, _ in gathered])
    for r, (*_, error) in enumerate(gathered):
        if error is not None:
            raise MismatchError(f"rank {r}: {error}")
    for key in options:
        values = [opts.get(key) for _, _, opts, _ in gathered]
        if len(set(values)) > 1:
            label = {"plan": "plans (fingerprints)", "cluster": "clusters"}.get(key, key)
            raise MismatchError(f"ranks passed different {label} to parallelize: "
                                + ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
                                + "; every rank must pass the same options")


def _check_same_signature(gathered: list[tuple[str, list]]) -> None:
    """Every rank's (fingerprint, parameter signature) equals rank 0's; the error names the first difference."""
    ref_fp, ref = gathered[0]
    for r, (fp, sig) in enumerate(gathered):
        if fp == ref_fp:
            continue
        if len(sig) != len(ref):
            raise MismatchError(f"rank {r} has a model with {len(sig)} parameters, rank 0 has {len(ref)}")
        for a, b in zip(ref, sig):
            if a != b:
                field = ("name", "shape", "dtype", "requires_grad")[next(i for i in range(4) if a[i] != b[i])]
                raise MismatchError(f"rank {r}'s model differs from rank 0's in the {field} of parameter {a[0]!r}: "
                                    f"{b[('name', 'shape', 'dtype', 'requires_grad').index(field)]} vs {a[('name', 'shape', 'dtype', 'requires_grad').index(field)]}")
        raise MismatchError(f"rank {r}'s model differs from rank 0's")


def _broadcast_state(model: nn.Module, group, world: int) -> None:
    if world == 1:
        return
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=src, group=group)


def _load(obj, cls):
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return cls.load(obj)
    raise CaramelError(f"expected a {cls.__name__} or a path to one, got {type(obj).__name__}")


def _trace_path(trace, rank: int, world: int) -> Path | None:
    if trace is None:
        env = os.environ.get("CARAMEL_TRACE")
        if not env:
            return None
        return Path(env) / f"trace.rank{rank}.json"
    path = Path(trace)
    if world > 1:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix or '.json'}")
    return path


def _save_at_exit(engine: Engine, path: Path) -> None:
    ref = weakref.ref(engine)

    def save():
        e = ref()
        if e is not None and e.recorder.enabled:
            meta = {"plan": e.plan.fingerprint if e.plan else None, "overlap": e.overlap}
            if e.plan is not None:
                meta.update(window_meta(e.plan))
            try:
                meta.update(_save_plan_inputs(e, path))
            except (OSError, ValueError) as err:  # the trace matters more than the plan's inputs
                warnings.warn(f"caramel: could not write the plan's profile and cluster beside {path}: {err}")
            e.recorder.save(path, meta=meta)
    engine.set_trace_writer(path, save)
    atexit.register(save)


def _save_plan_inputs(engine: Engine, path: Path) -> dict[str, str]:
    """On the rank that plans (0): the profile and the cluster its last plans were made from,
    beside the trace (`<trace>.profile.json`, `<trace>.cluster.json`), so that `caramel plan
    --profile ... --cluster ...` makes the same plan offline (with the same planner, options and
    overlap). Online, both are measured inside the job (the ready times under the host's load,
    the link as the profiling steps' collectives found it), so no later run sees them again.
    Their file names, for the trace's meta; none on the other ranks or before a plan."""
    c = engine.controller
    if c is None or c.rank != 0 or c.profile is None or c.plan_cluster is None:
        return {}
    names = {}
    for kind, obj in (("profile", c.profile), ("cluster", c.plan_cluster)):
        out = path.with_name(f"{path.stem}.{kind}.json")
        obj.save(out)
        names[f"planned_from_{kind}"] = out.name
    return names
