"""What a `ps` checkpoint holds besides the servers' optimizer state, so that a resumed run
goes on as the uninterrupted one would.

Without it a resumed run starts over: two profiling steps (run synchronously, as bsp), a new
plan from their timings (another placement or order may come out), the step count at 0, and
under `staleness=predict` no latest update to extrapolate with, so the first forwards that
lack an update are not extrapolated. The `caramel_ps` entry of `optimizer.state_dict()`
(`VERSION`) carries:

- the plan in force, which module's pre-hook waits for which parameters, the parameters no
  module uses, and the pulls' measured time: a resumed run adopts the plan and does not
  profile again (`restore`);
- the steps pushed so far (every update is applied and pulled at `synchronize()`, so every
  parameter is at that version);
- with `staleness=pace`, `predict` or `compensate`: every rank's busy seconds at the latest
  update (who is the slowest); with predict, each parameter's latest update by name; with
  compensate, every server's running mean square of the gradient by name (gathered at
  `synchronize()`, as the optimizer state; each server takes its own back). The versions a
  server keeps need no saving: after `synchronize()` every rank is at the latest one.
  `staleness=scale` needs nothing more (each update carries its own lags). The `lr_scaled`
  and `updates_applied` counters start again at 0 in a resumed run (a fresh engine); `steps`
  does not.

All of it is the same on every rank once `synchronize()` has run (each rank's latest update of
a parameter is the same difference of the same two versions), so the state dict of any one
rank resumes all of them; `caramel train` saves rank 0's. A checkpoint without the entry (saved
before it existed) loads as before: the run profiles again. A plan that does not fit the
resumed run (other shards, other parameters, or a plan made with another `order`,
`placement`, `seed` or `bucket_cap_mb`) is not adopted: the run profiles again, with one
note on stdout; an entry that is no mapping or lacks its fields is one error; a newer entry version is refused with one error. With dedicated servers only
the optimizer state is restored (the servers keep their own plan and step count).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from caramel.errors import CaramelError
from caramel.strategies.ps.planner import PsPlan

if TYPE_CHECKING:
    from caramel.strategies.ps.run import PsRun

STATE_KEY = "caramel_ps"
VERSION = 1


def run_state(run: PsRun) -> dict[str, Any]:
    """The entry (module docstring); call after `synchronize()` on every rank."""
    e = run.engine
    planned = not run.profiling
    out: dict[str, Any] = {
        "version": VERSION, "steps": e.steps,
        "plan": e.plan.to_dict() if planned else None,
        "plan_options": _plan_options(run),
        "waits": {k: list(v) for k, v in e.waits_for.items()} if planned else None,
        "unused": list(run.unused) if planned else None,
        "pull_comm_s": run.pull_comm_s,
        "staleness": None,
    }
    if e.stale is not None:
        out["staleness"] = {"peer_busy_s": [float(x) for x in e.stale.peer_busy_s],
                            "delta": {e.names[i]: d.detach().cpu().clone() for i, d in e.stale.delta.items()}}
        if e.stale.dc is not None:  # gathered from every server at synchronize() (one rank: its own)
            gathered = run.dc_mean_sq if e.world > 1 else e.stale.dc.mean_sq
            out["staleness"]["dc_mean_sq"] = {e.names[i]: m.detach().cpu().clone() for i, m in gathered.items()}
    return out


PLAN_OPTIONS = ("order", "placement", "seed", "bucket_cap_mb", "pull_bucket_cap_mb")  # the options a plan is made from


def _plan_options(run: PsRun) -> dict[str, Any]:
    """The plan's options, the pull cap as in effect (a default one is bucket_cap_mb)."""
    return {k: run.options.pull_cap_mb() if k == "pull_bucket_cap_mb" else getattr(run.options, k) for k in PLAN_OPTIONS}


def restore(run: PsRun, entry: dict[str, Any]) -> None:
    """Adopt the saved plan (if it fits), step count and staleness state (every rank, after the
    optimizer's own state is loaded and before each rank drops the state it does not serve)."""
    if not isinstance(entry, dict):
        raise CaramelError(f"strategy 'ps': checkpoint entry {STATE_KEY!r} must be a mapping, got {type(entry).__name__}")
    version = entry.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CaramelError(f"strategy 'ps': checkpoint entry {STATE_KEY!r} has version {version!r}, newer than this "
                           f"caramel reads ({VERSION}); resume with the caramel that saved it")
    missing = [k for k in ("steps", "plan", "waits", "unused") if k not in entry]
    if missing:
        raise CaramelError(f"strategy 'ps': checkpoint entry {STATE_KEY!r} lacks {', '.join(missing)}; "
                           "it was not written by caramel")
    if run.groups.dedicated:  # the servers keep their own plan and count (a new plan reaches them by CMD_PLAN)
        return
    saved_options = entry.get("plan_options")
    if isinstance(saved_options, dict) and "pull_bucket_cap_mb" not in saved_options:  # saved before pull buckets:
        saved_options = {**saved_options, "pull_bucket_cap_mb": saved_options.get("bucket_cap_mb")}  # pulls = pushes
    if saved_options is not None and saved_options != _plan_options(run):
        print(f"strategy 'ps': the checkpoint's plan was made with {saved_options}, this run asks for "
              f"{_plan_options(run)}; profiling again", flush=True)
        plan = None
    else:
        plan = _fitting_plan(run, entry.get("plan"))
    if plan is not None:
        from caramel.strategies.ps.engine import PsEngine

        old = run.engine
        old.remove_hooks()
        e = PsEngine(run.module, run.optimizer, run.options, plan, run.groups, run.ranks, run.buffer_sync,
                     run.share_buffers)
        e.wait_s, e.sent_hparams = old.wait_s, old.sent_hparams
        e.set_waits({k: [int(i) for i in v] for k, v in entry["waits"].items()})
        run.unused = [int(i) for i in entry["unused"]]
        run.engine, run.profiling = e, 0
        if run.tracker is not None or run.timer is not None:  # a profiling step had begun: undo its hooks
            if run.tracker is not None and run.tracker._mode is not None:
                run.tracker.__exit__(None, None, None)
            if run.timer is not None:
                run.timer.remove()
            run.tracker = run.timer = None
    e = run.engine
    e.steps = int(entry["steps"])
    e.version = {i: e.steps for i in e.plan.params}
    if entry.get("pull_comm_s") is not None:
        run.pull_comm_s = float(entry["pull_comm_s"])
    stale = entry.get("staleness")
    if stale is not None and e.stale is not None:
        e.stale.peer_busy_s = [float(x) for x in stale["peer_busy_s"]]
        if e.stale.predicting:
            index = {n: i for i, n in enumerate(e.names)}
            e.stale.base, e.stale.at = {}, {}
            e.stale.delta = {index[n]: d.to(e.params[index[n]].device, e.params[index[n]].dtype)
                             for n, d in stale["delta"].items() if n in index}
        if e.stale.dc is not None and isinstance(stale.get("dc_mean_sq"), dict):  # each server takes its own
            index = {n: i for i, n in enumerate(e.names)}
            e.stale.dc.adopt({index[n]: m for n, m in stale["dc_mean_sq"].items() if n in index}, e.server_ranks(),
                             e.rank, e.params)


def _fitting_plan(run: PsRun, saved: dict[str, Any] | None) -> PsPlan | None:
    if saved is None:
        return None
    try:
        plan = PsPlan.from_dict(saved)
    except (TypeError, ValueError, KeyError, CaramelError) as e:
        print(f"strategy 'ps': the checkpoint's plan does not load ({e}); profiling again", flush=True)
        return None
    current = run.engine.plan
    if plan.shards != current.shards or sorted(plan.params) != sorted(current.params):
        print("strategy 'ps': the checkpoint's plan is for other shards or parameters; profiling again", flush=True)
        return None
    return plan

