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

from caramel.errors import CaramelError
from caramel.strategies.caramel.entry_checks import carries_on, check_header, digest, is_int, is_map, is_names, is_num

if TYPE_CHECKING:
    from caramel.strategies.caramel.controller import Controller

KEY = "profiling"
VERSION = 1
_REQUIRED = ("world", "inputs", "model_fingerprint", "profile_steps", "measure_split", "engine_steps", "step_calls",
             "order_replans", "ranks")
# what every rank holds alike (compared across ranks, with each rank's phase_step)
_SHARED = ("world", "inputs", "model_fingerprint", "profile_steps", "measure_split", "engine_steps", "step_calls",
           "order_replans")
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
    """One clear error for an entry caramel did not write or cannot read: every field this code
    uses, of every rank's part the entry holds (ranks that load one merged file fail alike)."""
    check_header(entry, KEY, VERSION, _REQUIRED)
    bad = []
    for k, lo in (("world", 2), ("profile_steps", 1), ("engine_steps", 0), ("step_calls", 0), ("order_replans", 0)):
        if not is_int(entry[k], lo):
            bad.append(f"{k} ({entry[k]!r}, an integer >= {lo})")
    if not isinstance(entry["measure_split"], bool):
        bad.append(f"measure_split ({entry['measure_split']!r}, true or false)")
    if not is_map(entry["inputs"], lambda v: True):
        bad.append("inputs (the options, a mapping of names)")
    if not isinstance(entry["model_fingerprint"], str):
        bad.append("model_fingerprint (a string)")
    if bad:
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed {', '.join(bad)}")
    ranks, steps = entry["ranks"], entry["profile_steps"]
    if not isinstance(ranks, dict) or not all(isinstance(own, dict) and set(_OWN) <= set(own) for own in ranks.values()):
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed ranks (each rank's measurements: "
                           f"{', '.join(_OWN)})")
    for r, own in ranks.items():
        phase = own["phase_step"]
        if not is_int(phase, 0) or phase >= 2 + steps or (phase >= 1 and own["module_order"] is None):
            raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed phase_step {phase!r} of rank {r} "
                               f"(0 to {steps!r} + 1 steps profiled, module uses from step 1 on)")
        bad = [k for k, ok in _own_checks(own) if not ok]
        if bad:
            raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed {', '.join(bad)} of rank {r} "
                               "(as OnlineProfiler.carried writes them)")
    if len({own["phase_step"] for own in ranks.values()}) > 1:
        phases = ", ".join(f"rank {r}: {own['phase_step']}" for r, own in ranks.items())
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has ranks at different phase_steps ({phases}); "
                           "every rank profiles the same steps")


def _own_checks(own: dict[str, Any]) -> list[tuple[str, bool]]:
    uses = own["module_order"] is not None  # module uses watched (step 0 done)
    return [
        ("first_use", (own["first_use"] is None and not uses) or (isinstance(own["first_use"], list) and all(
            isinstance(u, list) and len(u) == 3 and is_int(u[0], 0) and isinstance(u[1], str) and is_num(u[2])
            for u in own["first_use"]))),
        ("use_modules", (own["use_modules"] is None and not uses) or (isinstance(own["use_modules"], list) and all(
            isinstance(u, list) and len(u) == 2 and is_int(u[0], 0) and is_names(u[1]) for u in own["use_modules"]))),
        ("module_order", own["module_order"] is None or is_names(own["module_order"])),
        ("weight_s", is_map(own["weight_s"], is_num)),
        ("kept", is_map(own["kept"], lambda v: is_int(v, 0))),
        ("input_bytes", is_map(own["input_bytes"], lambda v: is_int(v, 0))),
        ("sizes_taken", isinstance(own["sizes_taken"], bool)),
        ("samples", isinstance(own["samples"], list) and all(_is_sample(x) for x in own["samples"])),
        ("log", isinstance(own["log"], list) and all(
            isinstance(e, list) and len(e) == 3 and is_num(e[0]) and is_num(e[1]) and is_num(e[2]) and e[2] >= 0
            for e in own["log"])),
    ]


def _is_sample(x: Any) -> bool:
    """One timed step as `StepSample` (dataclasses.asdict) writes it."""
    def indexed(d: Any) -> bool:  # parameter index -> seconds (the index an int, or its string)
        return isinstance(d, dict) and all(is_num(v) and (is_int(k) or (isinstance(k, str) and k.isdigit()))
                                           for k, v in d.items())
    return (isinstance(x, dict) and all(is_num(x.get(k)) for k in ("forward_s", "backward_s", "optimizer_s"))
            and is_map(x.get("module_start_s"), is_num) and indexed(x.get("ready_s")) and indexed(x.get("rows_ready_s")))


def restore_profiling(c: Controller, entry: Any) -> None:
    """Go on profiling from the entry's phase from the next step (every rank), or say why not and
    profile from the start, as the engine would without it (module docstring). Each rank checks
    all it will use before the ranks exchange verdicts (`entry_checks.agree`): an error is raised
    on every rank, a refusal made by every rank."""
    problem = None
    try:
        check_entry(entry)
    except CaramelError as e:
        problem = str(e)
    if not carries_on(c, problem, lambda: _unfit(c, entry),
                      lambda: digest({**entry, "phase_step": _own(entry, c.rank).get("phase_step")},
                                     _SHARED + ("phase_step",)),
                      "profiling is not carried on: {unfit}; the engine profiles from the start"):
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
    used = set(own["weight_s"]) | set(own["kept"]) | set(own["module_order"] or [])
    used |= {m for _, ms in own["use_modules"] or [] for m in ms} | {m for _, m, _ in own["first_use"] or []}
    if not used <= names:
        return "it names modules this model lacks"
    return None


def _own(entry: dict[str, Any], rank: int) -> dict[str, Any]:
    ranks = entry["ranks"]
    return ranks.get(rank, ranks.get(str(rank), {}))
