"""An overlap trial carried half-way in a checkpoint, so that a resumed run finishes it alike.

A checkpoint taken while `overlap="auto"` tries its candidates holds no settled plan
(`plan_state`). Without more, the resumed engine profiles again, plans from its own timings and
starts a new trial: other plans, other steps counted, possibly another choice, and with a codec
that works per bucket (top-k) other parameters from the first resumed step. This entry (`trial`
in the controller's `adaptive_state`, `VERSION`) carries the trial as it stands:

- what every rank holds alike: the candidates (name, overlap mode, plan with its codecs, and
  `plan_ref`, the first candidate holding the same plan object: `restored_candidates`), the
  order of preference and the predictions it came from, the blocks still to run and where in
  them the next step falls (`block`, `in_block`), the passes so far, a confirmation's selection,
  the profile, cluster and module uses the candidates were planned from, the engine's step
  counts and the options (`plan_inputs`, compared like the plan in force's);
- `ranks`: rank -> the step periods that rank counted for each candidate, block by block. Each
  rank's `optimizer.state_dict()` holds its own; `caramel train` gathers every rank's into the
  checkpoint rank 0 writes (`balance_state.merge_rank_states`).

A fresh engine that loads the entry adopts the candidate the trial runs now and goes on
recording into the carried periods: the remaining blocks, the decision (one all-reduce of
every candidate's median over carried and new periods), any further pass or confirmation, as
the uninterrupted run would. Only the periods measured after the resume are new timings.

A malformed entry or a newer version is one error. An entry that does not fit (other options,
model or number of workers, or a rank whose periods it lacks, as when one rank's state dict is
loaded by all) is not adopted by any rank: rank 0 says why and the engine chooses again, as it
did before this entry existed (all ranks agree or none adopts, as for the plan in force).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.caramel.trial import Candidate, OverlapTrial
from caramel.topology.spec import ClusterSpec

if TYPE_CHECKING:
    from caramel.strategies.caramel.controller import Controller

KEY = "trial"
VERSION = 1
_REQUIRED = ("candidates", "preference", "steps", "max_passes", "confirm", "predicted_s", "passes", "selection",
             "blocks", "block", "in_block", "profile", "cluster", "module_uses", "module_order", "inputs",
             "engine_steps", "step_calls", "order_replans", "ranks")


def trial_state(c: Controller) -> dict[str, Any] | None:
    """The entry (module docstring), or None when no trial runs (or it is not yet planned)."""
    t = c.trial
    if c.world == 1 or t is None or c.profiling:
        return None
    e = c.engine
    return {"version": VERSION, "world": c.world,
            "candidates": [{"name": k.name, "overlap": k.overlap, "plan": k.plan.to_dict(), "plan_ref": _plan_ref(t, i)}
                           for i, k in enumerate(t.candidates)],
            "preference": list(t.preference), "steps": t.steps, "max_passes": t.max_passes, "confirm": t.confirm,
            "predicted_s": dict(t.predicted_s), "passes": t.passes,
            "selection": t.selection, "blocks": [[i, n] for i, n in t.blocks], "block": t.block,
            "in_block": t.in_block,
            "profile": c.profile.to_dict() if c.profile is not None else None,
            "cluster": c.plan_cluster.to_dict() if c.plan_cluster is not None else None,
            "module_uses": {k: list(v) for k, v in c.module_uses.items()} if c.module_uses is not None else None,
            "module_order": e.module_order(), "inputs": dict(c.plan_inputs),
            "engine_steps": e.stats.step, "step_calls": e.step_calls, "order_replans": c.checks.order_replans,
            "ranks": {c.rank: {"blocks_s": [[list(b) for b in k.blocks_s] for k in t.candidates]}}}


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
    cands, blocks = entry["candidates"], entry["blocks"]
    bad = []
    if not isinstance(cands, list) or not cands or not all(
            isinstance(k, dict) and {"name", "overlap", "plan"} <= set(k) and isinstance(k["plan"], dict) for k in cands):
        bad.append("candidates (a non-empty list of name, overlap and plan)")
    elif not all(isinstance(k.get("plan_ref", i), int) and not isinstance(k.get("plan_ref", i), bool)
                 and 0 <= k.get("plan_ref", i) <= i for i, k in enumerate(cands)):
        bad.append("candidates' plan_ref (the index of the first candidate holding the same plan)")
    elif not isinstance(blocks, list) or not all(
            isinstance(b, (list, tuple)) and len(b) == 2 and 0 <= b[0] < len(cands) and b[1] > 0 for b in blocks):
        bad.append("blocks (pairs of a candidate's index and a number of steps)")
    elif not (0 <= entry["block"] < len(blocks) and 0 <= entry["in_block"] < blocks[entry["block"]][1]):
        bad.append(f"block/in_block ({entry['block']}/{entry['in_block']} of {len(blocks)} blocks)")
    if not isinstance(entry["ranks"], dict):
        bad.append("ranks (a mapping of rank to its periods)")
    elif not all(isinstance(own, dict) and isinstance(own.get("blocks_s"), list)
                 and len(own["blocks_s"]) == len(cands) for own in entry["ranks"].values()):
        bad.append("ranks (each rank's periods, one list of blocks per candidate)")
    if not isinstance(entry["steps"], int) or entry["steps"] < 2:
        bad.append(f"steps ({entry['steps']!r}, an integer >= 2)")
    if bad:
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed {', '.join(bad)}")


def restore_trial(c: Controller, entry: Any) -> None:
    """Go on with the entry's trial from the next step (every rank, the same shared part), or say
    why not and leave the engine's own course (module docstring)."""
    check_entry(entry)
    if c.world == 1:
        return
    whys: list[str | None] = [None] * c.world
    dist.all_gather_object(whys, _unfit(c, entry), group=c.group)
    unfit = [(r, w) for r, w in enumerate(whys) if w is not None]
    if unfit:
        if c.rank == 0:
            r, why = unfit[0]
            print(f"caramel: the checkpoint's overlap trial is not carried on: {why} (rank {r}); the schedule "
                  f"is chosen again", flush=True)
        return
    cands = restored_candidates(entry)
    for cand, blocks in zip(cands, _own(entry, c.rank)["blocks_s"]):
        cand.blocks_s = [[float(p) for p in b] for b in blocks]
    trial = OverlapTrial(cands, int(entry["steps"]), c.group, c.world, preference=list(entry["preference"]) or None,
                         max_passes=int(entry["max_passes"]), confirm=bool(entry["confirm"]),
                         predicted_s=dict(entry["predicted_s"]))
    trial.passes, trial.selection = int(entry["passes"]), entry["selection"]
    trial.blocks = [(int(i), int(n)) for i, n in entry["blocks"]]
    trial.block, trial.in_block = int(entry["block"]), int(entry["in_block"])
    if c.profiler is not None:
        c.profiler.detach()
        c.profiler.stop()
        c.profiler = None
    c.uses_pending, c.use_tracker = False, None
    c.profile = ModelProfile.from_dict(entry["profile"], source="checkpoint") if entry["profile"] is not None else None
    uses = entry["module_uses"]
    c.module_uses = {k: [int(i) for i in v] for k, v in uses.items()} if uses is not None else None
    c.plan_cluster = ClusterSpec.from_dict(entry["cluster"], source="checkpoint") if entry["cluster"] is not None else None
    c.trial = trial
    c.adopt_candidate(trial.current, source="checkpoint (overlap trial)", module_order=entry["module_order"])
    c.engine.stats.step = int(entry["engine_steps"])
    c.engine.step_calls = int(entry["step_calls"])
    c.checks.order_replans = int(entry["order_replans"])


def _plan_ref(t: OverlapTrial, i: int) -> int:
    # the first candidate holding candidate i's plan object (i itself when none before it does)
    plan = t.candidates[i].plan
    return next(j for j, k in enumerate(t.candidates) if k.plan is plan)


def restored_candidates(entry: dict[str, Any]) -> list[Candidate]:
    """The entry's candidates, sharing plan objects exactly as the saving run's did (`plan_ref`;
    a given plan in each mode shares one). Plans that merely coincide stay apart: the controller
    switches candidates unless the next one's plan is the very object in force, so two equal
    plans shared by mistake (the planner's backward plan and DDP's schedule on a small model)
    would skip the hand-over to torch DDP. An entry without `plan_ref` shares none."""
    cands: list[Candidate] = []
    for i, k in enumerate(entry["candidates"]):
        ref = k.get("plan_ref", i)
        plan = cands[ref].plan if ref != i else Plan.from_dict(k["plan"], source="checkpoint")
        cands.append(Candidate(str(k["name"]), str(k["overlap"]), plan))
    return cands


def _unfit(c: Controller, entry: dict[str, Any]) -> str | None:
    """Why the saved trial does not fit this run (this rank), or None."""
    saved, mine = entry["inputs"] or {}, c.plan_inputs
    diffs = [f"{k}={saved.get(k)!r} (this run {mine.get(k)!r})" for k in sorted(set(saved) | set(mine))
             if saved.get(k) != mine.get(k)]
    if diffs:
        return "it was run with " + ", ".join(diffs)
    if entry.get("world") != c.world:
        return f"it was run by {entry.get('world')} workers, this job has {c.world}"
    plans = [k["plan"] for k in entry["candidates"]]
    if any(p.get("world_size") != c.world for p in plans):
        return f"its plans were made for {plans[0].get('world_size')} workers, this job has {c.world}"
    if any(p.get("model_fingerprint") != c.fingerprint for p in plans):
        return "its plans were made for a model with other parameters"
    if not _own(entry, c.rank):
        return "it holds no step periods of this rank (each rank's state dict holds its own)"
    return None


def _own(entry: dict[str, Any], rank: int) -> dict[str, Any]:
    ranks = entry["ranks"]
    return ranks.get(rank, ranks.get(str(rank), {}))
