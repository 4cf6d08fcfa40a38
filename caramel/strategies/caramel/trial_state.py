"""An overlap trial carried half-way in a checkpoint, so that a resumed run finishes it alike.

A checkpoint taken while `overlap="auto"` tries its candidates holds no settled plan
(`plan_state`). Without more, the resumed engine profiles again, plans from its own timings and
starts a new trial: other plans, other steps counted, possibly another choice, and with a codec
that works per bucket (top-k) other parameters from the first resumed step. This entry (`trial`
in the controller's `adaptive_state`, `VERSION`) carries the trial as it stands:

- what every rank holds alike: the candidates (name, overlap mode, plan with its codecs, and
  `plan_ref`, the first candidate holding the same plan object: `restored_candidates`), the
  order of preference and the predictions it came from, the blocks still to run and where in
  them the next step falls (`block`, `in_block`), the passes so far (`retimed`: those re-timed),
  a confirmation's selection and whether its blocks ran again (`confirm_retimed`), the profile, cluster and module uses the candidates were planned from, the engine's step
  counts and the options (`plan_inputs`, compared like the plan in force's), and `ran`, the
  blocks run so far with their steps (the result's record; optional: a trial resumed from an
  entry written without it records its blocks from the resume);
- `ranks`: rank -> the step periods that rank counted for each candidate, block by block, with
  its local batch size in each (`blocks_n`) and in the last counted step (`last_n`; both
  optional: an entry written without them carries periods whose shares are unknown, which the
  trial then does not compare on the latest shares: `OverlapTrial._at_latest_shares`). Each
  rank's `optimizer.state_dict()` holds its own; `caramel train` gathers every rank's into the
  checkpoint rank 0 writes (`balance_state.merge_rank_states`).

A fresh engine that loads the entry adopts the candidate the trial runs now and goes on
recording into the carried periods: the remaining blocks, the decision (one all-reduce of
every candidate's median over carried and new periods), any further pass or confirmation, as
the uninterrupted run would. Only the periods measured after the resume are new timings.

A malformed entry or a newer version is one error, raised on every rank (`entry_checks.agree`:
each rank checks and parses its entry before the ranks exchange verdicts). An entry that does not fit (other options,
model or number of workers, or a rank whose periods it lacks, as when one rank's state dict is
loaded by all) is not adopted by any rank: rank 0 says why and the engine chooses again, as it
did before this entry existed (all ranks agree or none adopts, as for the plan in force); so
is an entry whose shared part differs between ranks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from caramel.errors import CaramelError
from caramel.strategies.caramel.entry_checks import carries_on, check_header, digest, is_int, is_map, is_names, is_num
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.caramel import trial_shares
from caramel.strategies.caramel.trial import Candidate, OverlapTrial
from caramel.topology.spec import ClusterSpec

if TYPE_CHECKING:
    from caramel.strategies.caramel.controller import Controller

KEY = "trial"
VERSION = 1
# what every rank holds alike (compared across ranks); the profile and cluster may be a rank's own
_SHARED = ("world", "inputs", "candidates", "preference", "steps", "max_passes", "confirm", "predicted_s", "passes",
           "selection", "blocks", "block", "in_block", "engine_steps", "step_calls", "order_replans", "ran", "retimed",
           "confirm_retimed")
_REQUIRED = ("world", "candidates", "preference", "steps", "max_passes", "confirm", "predicted_s", "passes", "selection",
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
            "in_block": t.in_block, "ran": [list(b) for b in t.ran], "retimed": t.retimed,
            "confirm_retimed": t.confirm_retimed,
            "profile": c.profile.to_dict() if c.profile is not None else None,
            "cluster": c.plan_cluster.to_dict() if c.plan_cluster is not None else None,
            "module_uses": {k: list(v) for k, v in c.module_uses.items()} if c.module_uses is not None else None,
            "module_order": e.module_order(), "inputs": dict(c.plan_inputs),
            "engine_steps": e.stats.step, "step_calls": e.step_calls, "order_replans": c.checks.order_replans,
            "ranks": {c.rank: {"blocks_s": [[list(b) for b in k.blocks_s] for k in t.candidates],
                               "blocks_n": [[list(b) for b in k.blocks_n] for k in t.candidates], "last_n": t.last_n}}}


def check_entry(entry: Any, last_step: int | None = None) -> None:
    """One clear error for an entry caramel did not write or cannot read: every field this code
    uses, of every rank's part the entry holds (ranks that load one merged file fail alike)."""
    check_header(entry, KEY, VERSION, _REQUIRED)
    cands = entry["candidates"]
    if not (isinstance(cands, list) and cands and all(
            isinstance(k, dict) and isinstance(k.get("name"), str) and isinstance(k.get("overlap"), str)
            and isinstance(k.get("plan"), dict) for k in cands)):
        _malformed(["candidates (a non-empty list of name, overlap and plan)"])
    names = [k["name"] for k in cands]
    bad = []
    if len(set(names)) != len(names):
        bad.append("candidates (each name once)")
    if not all(is_int(k.get("plan_ref", i), 0) and k.get("plan_ref", i) <= i for i, k in enumerate(cands)):
        bad.append("candidates' plan_ref (the index of the first candidate holding the same plan)")
    pref = entry["preference"]
    if not (is_names(pref) and set(pref) <= set(names) and len(set(pref)) == len(pref)):
        bad.append(f"preference (candidate names, each once; got {pref!r})")
    for k, lo in (("steps", 2), ("max_passes", 1), ("passes", 1), ("world", 2), ("engine_steps", 0),
                  ("step_calls", 0), ("order_replans", 0), ("retimed", 0)):
        # retimed: optional, an entry written before it has none
        if (k in entry or k != "retimed") and not is_int(entry[k], lo):
            bad.append(f"{k} ({entry[k]!r}, an integer >= {lo})")
    for k in ("confirm", "confirm_retimed"):  # confirm_retimed: optional, as retimed
        if (k in entry or k == "confirm") and not isinstance(entry[k], bool):
            bad.append(f"{k} ({entry[k]!r}, true or false)")
    if not is_map(entry["predicted_s"], lambda v: v is None or is_num(v)):
        bad.append("predicted_s (candidate name -> seconds or null)")
    sel = entry["selection"]
    if sel is not None and not (isinstance(sel, dict) and sel.get("chosen") in names and isinstance(pref, list) and pref):
        bad.append("selection (null, or what the passes found: a candidate 'chosen', with a preference)")
    blocks, block, in_block = entry["blocks"], entry["block"], entry["in_block"]
    n_bad = len(bad)
    if not (isinstance(blocks, list) and blocks and all(
            isinstance(b, (list, tuple)) and len(b) == 2 and is_int(b[0], 0) and b[0] < len(cands) and is_int(b[1], 1)
            for b in blocks)):
        bad.append("blocks (pairs of a candidate's index and a number of steps)")
    elif not (is_int(block, 0) and block < len(blocks) and is_int(in_block, 0) and in_block < blocks[block][1]):
        bad.append(f"block/in_block ({block!r}/{in_block!r} of {len(blocks)} blocks)")
    placed = len(bad) == n_bad  # blocks, block and in_block well formed: `ran` is checked against them
    ran = entry.get("ran", [])  # optional: an entry written before the record has none
    if not (isinstance(ran, list) and all(isinstance(b, list) and len(b) == 3 and b[0] in names and is_int(b[1], 0)
                                          and is_int(b[2], 0) for b in ran)):
        bad.append("ran (the blocks run so far: candidate name, first step, last step)")
    elif placed:
        rule = _ran_rule(ran, names, blocks, block, in_block, entry["engine_steps"] if last_step is None else last_step)
        if rule:
            bad.append(f"ran ({rule})")
    for k in ("profile", "cluster"):
        if entry[k] is not None and not isinstance(entry[k], dict):
            bad.append(f"{k} (a mapping or null)")
    if entry["module_uses"] is not None and not is_map(entry["module_uses"], lambda v: isinstance(v, list) and all(is_int(i, 0) for i in v)):
        bad.append("module_uses (module name -> parameter indices, or null)")
    if entry["module_order"] is not None and not is_names(entry["module_order"]):
        bad.append("module_order (module names, or null)")
    if not is_map(entry["inputs"], lambda v: True):
        bad.append("inputs (the options, a mapping of names)")
    ranks = entry["ranks"]
    if not isinstance(ranks, dict):
        bad.append("ranks (a mapping of rank to its periods)")
    else:
        for r, own in ranks.items():
            periods = own.get("blocks_s") if isinstance(own, dict) else None
            if not (isinstance(periods, list) and len(periods) == len(cands) and all(
                    isinstance(bs, list) and all(isinstance(b, list) and all(is_num(p) for p in b) for b in bs)
                    for bs in periods)):
                bad.append(f"ranks (rank {r}'s periods: per candidate, a list of blocks of seconds)")
            elif not _sizes_fit(own, periods):
                bad.append(f"ranks (rank {r}'s blocks_n and last_n: a local batch size or null for each period)")
    if bad:
        _malformed(bad)


def _sizes_fit(own: dict, periods: list) -> bool:
    # optional (an entry written before them has neither): the shape of the periods, sizes or null
    sizes, last = own.get("blocks_n"), own.get("last_n")
    if last is not None and not is_int(last, 1):
        return False
    if sizes is None:
        return True
    return (isinstance(sizes, list) and len(sizes) == len(periods)
            and all(isinstance(ns, list) and len(ns) == len(bs) and all(
                isinstance(n, list) and len(n) == len(b) and all(x is None or is_int(x, 1) for x in n)
                for n, b in zip(ns, bs)) for ns, bs in zip(sizes, periods)))


def _ran_rule(ran: list, names: list[str], blocks: list, block: int, in_block: int, last_step: Any) -> str | None:
    """The rule `ran` breaks against the rest of the entry, if any. `ran` holds the last blocks
    started (all of them, unless recording began at a resume from an entry without it), each
    [name, first step, last step]: contiguous, the named candidate's, a whole block but the
    first (a fragment) and the one running (`in_block` steps), ending by `last_step`."""
    started = block + (in_block > 0)
    if len(ran) > started:
        return f"{len(ran)} blocks, more than the {started} started"
    for i, (name, first, last) in enumerate(ran):
        if first > last:
            return f"block {i} ends at step {last}, before its first step {first}"
        if i and first != ran[i - 1][2] + 1:
            return f"block {i} starts at step {first}, not right after step {ran[i - 1][2]}"
        j = started - len(ran) + i  # its index in `blocks`
        if name != names[blocks[j][0]]:
            return f"block {i} is {name!r}, the blocks run {names[blocks[j][0]]!r}"
        size = in_block if j == block else blocks[j][1]
        if (last - first + 1 > size) if i == 0 else (last - first + 1 != size):
            return f"block {i} has {last - first + 1} steps, the blocks run {size}"
    if ran and is_int(last_step, 0) and ran[-1][2] > last_step:
        return f"it ends at step {ran[-1][2]}, after the run's step {last_step}"
    return None


def _malformed(bad: list[str]) -> None:
    raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has malformed {', '.join(bad)}")


def restore_trial(c: Controller, entry: Any) -> None:
    """Go on with the entry's trial from the next step (every rank, the same shared part), or say
    why not and leave the engine's own course (module docstring). Each rank checks and parses
    all it will use before the ranks exchange verdicts (`entry_checks.agree`): an error is
    raised on every rank, a refusal made by every rank."""
    parsed, problem = None, None
    try:
        parsed = _parse(c, entry)
    except CaramelError as e:
        problem = str(e)
    if not carries_on(c, problem, lambda: _unfit(c, entry), lambda: digest(entry, _SHARED),
                      "overlap trial is not carried on: {unfit}; the schedule is chosen again"):
        return
    assert parsed is not None
    trial, profile, cluster = parsed
    if c.profiler is not None:
        c.profiler.detach()
        c.profiler.stop()
        c.profiler = None
    c.uses_pending, c.use_tracker = False, None
    c.profile, c.plan_cluster = profile, cluster
    uses = entry["module_uses"]
    c.module_uses = {k: list(v) for k, v in uses.items()} if uses is not None else None
    c.trial = trial
    c.adopt_candidate(trial.current, source="checkpoint (overlap trial)", module_order=entry["module_order"])
    c.engine.stats.step = int(entry["engine_steps"])
    c.engine.step_calls = int(entry["step_calls"])
    c.checks.order_replans = int(entry["order_replans"])


def _parse(c: Controller, entry: Any) -> tuple[OverlapTrial | None, ModelProfile | None, ClusterSpec | None]:
    """The trial, profile and cluster this rank would go on with (the trial None without this
    rank's part: `_unfit` says so); one CaramelError for anything malformed."""
    # the trial counts steps as the balancer does when there is one (controller._trial_step_end)
    check_entry(entry, last_step=c.balancer.step if c.balancer is not None else None)
    try:
        cands = restored_candidates(entry)
        profile = ModelProfile.from_dict(entry["profile"], source="checkpoint: trial profile") \
            if entry["profile"] is not None else None
        cluster = ClusterSpec.from_dict(entry["cluster"], source="checkpoint: trial cluster") \
            if entry["cluster"] is not None else None
    except CaramelError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # a nested field of a kind from_dict misses
        raise CaramelError(f"checkpoint: the caramel entry {KEY!r} has a malformed plan, profile or cluster: {e!r}")
    own = _own(entry, c.rank)
    if not own:
        return None, profile, cluster
    sizes = own.get("blocks_n") or [[[None] * len(b) for b in blocks] for blocks in own["blocks_s"]]
    for cand, blocks, ns in zip(cands, own["blocks_s"], sizes):
        cand.blocks_s = [[float(p) for p in b] for b in blocks]
        cand.blocks_n = [[None if n is None else int(n) for n in b] for b in ns]
    trial = OverlapTrial(cands, entry["steps"], c.group, c.world, preference=list(entry["preference"]) or None,
                         max_passes=entry["max_passes"], confirm=entry["confirm"], predicted_s=dict(entry["predicted_s"]),
                         sized=trial_shares.sized_by(c.balancer))
    trial.passes, trial.selection = entry["passes"], entry["selection"]
    trial.blocks = [(int(i), int(n)) for i, n in entry["blocks"]]
    trial.block, trial.in_block = entry["block"], entry["in_block"]
    trial.ran = [[str(n), int(a), int(b)] for n, a, b in entry.get("ran", [])]
    trial.retimed, trial.last_n = int(entry.get("retimed", 0)), own.get("last_n")
    trial.confirm_retimed = bool(entry.get("confirm_retimed", False))
    return trial, profile, cluster


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
        plan = cands[ref].plan if ref != i else Plan.from_dict(k["plan"], source=f"checkpoint: trial candidate {i}")
        cands.append(Candidate(str(k["name"]), str(k["overlap"]), plan))
    return cands


def _unfit(c: Controller, entry: dict[str, Any]) -> str | None:
    """Why the saved trial does not fit this run (this rank), or None."""
    saved, mine = entry["inputs"] or {}, c.plan_inputs
    diffs = [f"{k}={saved.get(k)!r} (this run {mine.get(k)!r})" for k in sorted(set(saved) | set(mine))
             if saved.get(k) != mine.get(k)]
    # the trial's own lengths are options too: a saved trial does not finish with other ones
    for name, saved_n, mine_n in (("trial_steps", entry["steps"], c.trial_steps),
                                  ("trial_passes", entry["max_passes"], c.trial_passes)):
        if saved_n != mine_n:
            diffs.append(f"{name}={saved_n!r} (this run {mine_n!r})")
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
