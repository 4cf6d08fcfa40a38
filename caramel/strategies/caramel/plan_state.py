"""The plan in force, carried in a checkpoint, so that a resumed run goes on with it.

Without it a resumed engine starts over: a provisional plan (one bucket per ~25 MB in reverse
registration order) for its first profiling steps, then a plan from a new profile whose
timings are not the old run's, so other buckets, and with `overlap="auto"` another trial. The
sum a plain all-reduce makes does not depend on the buckets (two ranks), but a codec's result
does: top-k picks its entries per bucket, so another bucketing sends other entries and leaves
other residuals. Carrying the plan makes a resumed run repeat the uninterrupted one bit for
bit for every `compression` (none, fp16, bf16, topk, powersgd, auto); the codecs' own state
(error feedback, PowerSGD's Q factors) travels per rank beside it (`runtime.compression`).

The entry (`plan` in the controller's `adaptive_state`, `VERSION`) is written once the
schedule is settled (no profiling, no overlap trial, no forward being watched for module
uses) and holds the plan with its codecs, the overlap mode in force and whether torch DDP runs
it (DDP's schedule won the trial), the profile and link it was planned from (for later
bandwidth checks and re-plans), which module uses which parameter, the engine's step counts
(the periodic checks fall on the same steps) and the options the plan was made from
(`plan_inputs`). A checkpoint taken while profiling or trialling holds none; it carries the
profiling or the trial half-way instead (`profiling_state`, `trial_state`).

A fresh engine that loads the entry adopts its plan instead of profiling. One whose options
differ (another codec, planner, planner knob, overlap, cluster, given plan or profile) says so
on stdout (rank 0) and keeps its own course: it never runs a plan made for other options. A
saved plan for another model or number of workers is treated alike. `auto_plan` (version 1,
compression="auto" only, before this entry) is still read.
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.topology.spec import ClusterSpec

if TYPE_CHECKING:
    from caramel.strategies.caramel.controller import Controller

KEY = "plan"
LEGACY_AUTO_KEY = "auto_plan"  # version 1: compression="auto"'s plan only, no inputs
VERSION = 2


def plan_inputs(*, planner: str, planner_options: dict[str, Any], overlap: str, compression: str, split_tied: bool,
                balance: str, cluster: ClusterSpec | None, plan: Plan | None,
                profile: ModelProfile | None) -> dict[str, Any]:
    """What the plan in force was made from, as plain values (compared on resume)."""
    profile_sha = None
    if profile is not None:
        profile_sha = hashlib.sha256(json.dumps(profile.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"planner": planner, "planner_options": json.dumps(planner_options, sort_keys=True, default=str),
            "overlap": overlap, "compression": compression, "split_tied": split_tied, "balance": balance,
            "cluster": json.dumps(cluster.to_dict(), sort_keys=True, default=str) if cluster is not None else None,
            "given_plan": plan.fingerprint if plan is not None else None, "given_profile": profile_sha}


def plan_state(c: Controller) -> dict[str, Any] | None:
    """The entry (module docstring), or None while the schedule is still being chosen."""
    e = c.engine
    if c.world == 1 or e.plan is None or not c.settled():
        return None
    return {"version": VERSION, "plan": e.plan.to_dict(), "overlap": e.overlap, "ddp": bool(e.delegating),
            "profile": c.profile.to_dict() if c.profile is not None else None,
            "cluster": c.plan_cluster.to_dict() if c.plan_cluster is not None else None,
            "module_uses": {k: list(v) for k, v in c.module_uses.items()} if c.module_uses is not None else None,
            "module_order": e.module_order(), "inputs": dict(c.plan_inputs),
            "steps": e.stats.step, "step_calls": e.step_calls, "order_replans": c.checks.order_replans}


def restore_plan(c: Controller, entry: Any, legacy: bool = False) -> None:
    """Adopt the entry's plan from the next step (every rank, the same entry), or say why not."""
    key = LEGACY_AUTO_KEY if legacy else KEY
    if not isinstance(entry, dict):
        raise CaramelError(f"checkpoint: the caramel entry {key!r} must be a mapping, got {type(entry).__name__}")
    version = entry.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} has version {version!r}, expected an integer "
                           f"from 1 to {VERSION}; it was not written by caramel")
    if version > VERSION:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} has version {version!r}, newer than this caramel "
                           f"reads ({VERSION}); resume with the caramel that saved it")
    missing = [k for k in ("plan", "overlap", "profile", "cluster") if k not in entry]
    if missing:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} lacks {', '.join(missing)}; it was not written by caramel")
    bad = [k for k in ("plan", "inputs", "module_uses") if entry.get(k) is not None and not isinstance(entry[k], dict)]
    if "steps" in entry and not all(k in entry for k in ("step_calls", "order_replans")):
        bad.append("steps (without step_calls and order_replans)")
    if bad:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} has malformed {', '.join(bad)} (plan, inputs and "
                           f"module_uses are mappings; steps comes with step_calls and order_replans)")
    if c.world == 1:
        return  # one process runs no plan
    # one decision for the job: a rank that adopted while another profiled again would wait in
    # the plan check's collective while the other ran its profiling steps (ranks may differ in
    # what is not compared elsewhere, e.g. planner options only rank 0 uses)
    whys: list[str | None] = [None] * c.world
    dist.all_gather_object(whys, _unfit(c, entry, legacy), group=c.group)
    unfit = [(r, w) for r, w in enumerate(whys) if w is not None]
    if unfit:
        if c.rank == 0:
            r, why = unfit[0]
            print(f"caramel: the checkpoint's plan is not adopted: {why} (rank {r}); the schedule is "
                  f"chosen again", flush=True)
        return
    plan = Plan.from_dict(entry["plan"], source="checkpoint")
    profile = ModelProfile.from_dict(entry["profile"], source="checkpoint") if entry["profile"] is not None else None
    if c.profiler is not None:
        c.profiler.detach()
        c.profiler.stop()
        c.profiler = None
    c.trial = None
    c.uses_pending, c.use_tracker = False, None
    c.profile = profile
    uses = entry.get("module_uses")
    c.module_uses = ({k: [int(i) for i in v] for k, v in uses.items()} if uses is not None
                     else _uses_of(profile) if profile is not None else None)
    c.plan_cluster = ClusterSpec.from_dict(entry["cluster"], source="checkpoint") if entry["cluster"] is not None else None
    c.adopt(plan, source="checkpoint", overlap=entry["overlap"], module_order=entry.get("module_order"))
    if entry.get("ddp"):
        c.handover.hand_over()
    if "steps" in entry:
        c.engine.stats.step = int(entry["steps"])
        c.engine.step_calls = int(entry["step_calls"])
        c.checks.order_replans = int(entry["order_replans"])


def _unfit(c: Controller, entry: dict[str, Any], legacy: bool) -> str | None:
    """Why the saved plan does not fit this run, or None."""
    if legacy:  # saved for compression="auto" alone, before the inputs were recorded
        saved = {"compression": "auto"}
        mine = {"compression": c.plan_inputs.get("compression")}
    else:
        saved, mine = entry.get("inputs") or {}, c.plan_inputs
    diffs = [f"{k}={saved.get(k)!r} (this run {mine.get(k)!r})" for k in sorted(set(saved) | set(mine))
             if saved.get(k) != mine.get(k)]
    if diffs:
        return "it was made with " + ", ".join(diffs)
    plan = entry["plan"]
    if not isinstance(plan, dict) or plan.get("world_size") != c.world:
        got = plan.get("world_size") if isinstance(plan, dict) else None
        return f"it was made for {got} workers, this job has {c.world}"
    if plan.get("model_fingerprint") != c.fingerprint:
        return "it was made for a model with other parameters"
    return None


def _uses_of(profile: ModelProfile) -> dict[str, list[int]]:
    from caramel.strategies.caramel.profiling import module_uses
    return module_uses(profile)
