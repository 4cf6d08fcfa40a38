"""Online profiling carried half-way in a checkpoint, so that a resumed run finishes it alike.

A checkpoint taken during the engine's first steps, while it profiles the user's steps under
its provisional plan, holds no plan and no trial. Without more, the resumed engine profiles from
its first step again: the module uses, the split weight gradients and the timed steps once
more, so its profile ends later than the uninterrupted run's and rests on none of its timings.
This entry (`profiling` in the controller's `adaptive_state`, `VERSION`) carries the profiling
as it stands:

- what every rank holds alike: the options (`plan_inputs`, `profile_steps`, whether weight
  gradients are timed apart), the model's fingerprint, the engine's step counts;
- `ranks`: rank -> what that rank measured (`OnlineProfiler.carried`): the phase (which step
  comes next), which module uses which parameter and the forward's order, each deferrable
  module's weight-gradient time and kept bytes, the bytes each module's forward takes, the timed
  steps, and the collectives timed for the measured cluster. `caramel train` gathers every
  rank's into the checkpoint rank 0 writes.

A fresh engine that loads the entry goes on at the saved phase: it runs the remaining profiling
steps only, builds the profile from the carried and the new samples, and measures the cluster
from the carried and the new collectives, so that its plan and any overlap trial start at the
step the uninterrupted run's did. Timings taken after the resume are new; the carried ones are
the saved run's. Errors and fall-backs are those of the trial's entry (`trial_state`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from caramel.errors import CaramelError

if TYPE_CHECKING:
    from caramel.strategies.caramel.controller import Controller

KEY = "profiling"
VERSION = 1
_REQUIRED = ("world", "inputs", "model_fingerprint", "profile_steps", "measure_split", "engine_steps", "step_calls",
             "order_replans", "ranks")
_OWN = ("phase_step", "first_use", "use_modules", "module_order", "weight_s", "kept", "input_bytes", "sizes_taken",
        "samples", "log")


def profiling_state(c: Controller) -> dict[str, Any] | None:
    """The entry (module docstring), or None when the engine does not profile now."""
    p = c.profiler
    if c.world == 1 or p is None:
        return None
    e = c.engine
    return {"version": VERSION, "world": c.world, "inputs": dict(c.plan_inputs), "model_fingerprint": c.fingerprint,
            "profile_steps": p.profile_steps, "measure_split": p.measure_split, "engine_steps": e.stats.step,
            "step_calls": e.step_calls, "order_replans": c.checks.order_replans, "ranks": {c.rank: p.carried()}}


def check_entry(entry: Any) -> None:
    """One clear error for an entry caramel did not write or cannot read."""
    if not isinstance(entry, dict):
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} must be a mapping, got {type(entry).__name__}")
    version = entry.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has version {version!r}, expected an integer "
                           f"from 1 to {VERSION}; it was not written by caramel")
    if version > VERSION:
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has version {version!r}, newer than this caramel "
                           f"reads ({VERSION}); resume with the caramel that saved it")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} lacks {', '.join(missing)}; it was not written "
                           "by caramel")
    ranks, steps = entry["ranks"], entry["profile_steps"]
    if not isinstance(ranks, dict) or not all(isinstance(own, dict) and set(_OWN) <= set(own) for own in ranks.values()):
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed ranks (each rank's measurements: "
                           f"{', '.join(_OWN)})")
    for r, own in ranks.items():
        phase = own["phase_step"]
        if (isinstance(phase, bool) or not isinstance(phase, int) or not isinstance(steps, int)
                or not 0 <= phase < 2 + steps or (phase >= 1 and own["module_order"] is None)):
            raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed phase_step {phase!r} of rank {r} "
                               f"(0 to {steps!r} + 1 steps profiled, module uses from step 1 on)")


def restore_profiling(c: Controller, entry: Any) -> None:
    """Go on profiling from the entry's phase from the next step (every rank), or say why not and
    profile from the start, as the engine would without it (module docstring)."""
    check_entry(entry)
    if c.world == 1:
        return
    whys: list[str | None] = [None] * c.world
    dist.all_gather_object(whys, _unfit(c, entry), group=c.group)
    unfit = [(r, w) for r, w in enumerate(whys) if w is not None]
    if unfit:
        if c.rank == 0:
            r, why = unfit[0]
            print(f"caramel: the checkpoint's profiling is not carried on: {why} (rank {r}); the engine profiles "
                  f"from the start", flush=True)
        return
    c.start_profiling()  # a fresh profiler under the provisional plan, then the saved phase
    c.profiler.resume_from(_own(entry, c.rank))
    c.engine.stats.step = int(entry["engine_steps"])
    c.engine.step_calls = int(entry["step_calls"])
    c.checks.order_replans = int(entry["order_replans"])


def _unfit(c: Controller, entry: dict[str, Any]) -> str | None:
    """Why the saved profiling does not fit this run (this rank), or None."""
    saved, mine = entry["inputs"] or {}, c.plan_inputs
    diffs = [f"{k}={saved.get(k)!r} (this run {mine.get(k)!r})" for k in sorted(set(saved) | set(mine))
             if saved.get(k) != mine.get(k)]
    if entry["profile_steps"] != c.profile_steps:
        diffs.append(f"profile_steps={entry['profile_steps']!r} (this run {c.profile_steps!r})")
    split = c.planner_options.get("compute_schedule", "auto") != "off"
    if entry["measure_split"] != split:
        diffs.append(f"weight gradients timed apart={entry['measure_split']!r} (this run {split!r})")
    if diffs:
        return "it was run with " + ", ".join(diffs)
    if entry["world"] != c.world:
        return f"it was run by {entry['world']} workers, this job has {c.world}"
    if entry["model_fingerprint"] != c.fingerprint:
        return "it was run for a model with other parameters"
    own = _own(entry, c.rank)
    if not own:
        return "it holds no measurements of this rank (each rank's state dict holds its own)"
    names = {n for n, _ in c.model.named_modules()}
    if not set(own["weight_s"]) | set(own["kept"]) <= names:
        return "it names modules this model lacks"
    return None


def _own(entry: dict[str, Any], rank: int) -> dict[str, Any]:
    ranks = entry["ranks"]
    return ranks.get(rank, ranks.get(str(rank), {}))
