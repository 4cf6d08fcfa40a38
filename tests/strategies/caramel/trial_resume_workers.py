"""Worker functions for the trial-resume test (spawned; must be importable).

`trial_resume_worker` runs `STEPS` steps of SmallCNN under `overlap="auto"` with top-k
uninterrupted, saving a checkpoint at each step of `RESUME_AT`; then, from the first of those,
fresh model, optimizer and engine objects run the rest, saving and resuming again at the second
(torch.save and torch.load(weights_only=True), as `caramel train` does). Two checkpoints fall in the online
profiling (the profiling arm resumes from them and runs into the trial's first step), two in the
overlap trial, in its second block and in its confirmation (the trial arm resumes from them). The trial reads each step's period
from a fake clock (the trial's baseline 13 ms, any other candidate 10 ms, plus a few tenths of a
millisecond by step), so both runs must decide alike and, with the decision forced the same,
end with the same parameters bit for bit. The real clock still times the profiling steps: the
plans come from those timings, which the checkpoint carries.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io

import torch
import torch.nn.functional as F

import caramel
from caramel.models.zoo import SmallCNN
from tests.distributed.workers import params_of
from tests.strategies.adapt.resume_workers import _batch, _dataset, _roundtrip

# profiling: steps 0-3 (uses, split, 2 timed); the trial of 2 candidates: 4-11 (blocks of 2, 4, 2
# steps); the challenger's confirmation: 12-19; then the plan adopted runs. The profiling arm
# resumes at its first checkpoints (the split step next; one timed step carried) and runs into
# the trial's first step; the trial arm resumes at the other two (the trial's second block; the
# confirmation's second block) and runs to the end.
STEPS = 22
PROFILING_AT, RESUME_AT = (1, 3), (7, 15)
OPTIONS = {"overlap": "auto", "compression": "topk:0.1", "profile_steps": 2, "trial_steps": 2, "trial_passes": 1}


class _TrialClock:
    """Replaces an engine's `EngineStats` class: the step period the trial reads is set by the
    candidate running (`controller`), whatever the real clock says; but a step the engine has
    no period for (a process's first) reads as the engine left it."""

    controller = None

    @property
    def last_step_s(self) -> float | None:
        real = self.__dict__.get("last_step_s")
        if not real:
            return real
        trial = self.controller.trial
        noise_s = 0.0002 * ((self.step * 7) % 5)
        if trial is None:
            return 0.02 + noise_s
        return (0.013 if trial.current.name == trial.baseline else 0.010) + noise_s

    @last_step_s.setter
    def last_step_s(self, value: float | None) -> None:
        self.__dict__["last_step_s"] = value


def _build(options: dict, model_state: dict | None):
    torch.manual_seed(0)
    m = SmallCNN()
    if model_state is not None:
        m.load_state_dict(model_state)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    model, opt = caramel.parallelize(m, opt, **options)
    stats = opt.engine.stats
    stats.__class__ = type("TrialClockStats", (_TrialClock, type(stats)), {"controller": opt.engine.controller})
    return model, opt


def _periods(opt) -> list | None:
    trial = opt.engine.controller.trial
    # copies: the trial goes on appending to its lists
    return None if trial is None else [[list(b) for b in k.blocks_s] for k in trial.candidates]


def _run(rank: int, at: tuple[int, ...], start: dict | None = None, steps: int = STEPS) -> dict:
    """Uninterrupted (`start` None), saving a checkpoint before each step of `at`; or resumed
    from `start` (the uninterrupted run's checkpoint before step `at[0]`), saving before each
    later step of `at` and resuming from each in fresh objects."""
    xs, ys = _dataset()
    first = 0 if start is None else at[0]
    model, opt = _build(OPTIONS, None if start is None else start["model"])
    saved_at: dict[int, dict] = {}
    for s in range(first, steps):
        if s in at:
            opt.synchronize()
            saved = start if s == first and start is not None else _roundtrip(
                {"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                 "optimizer": opt.state_dict()})
            saved_at[s] = {"saved": saved, "periods": _periods(opt)}
            if start is not None:
                if s != first:
                    model, opt = _build(OPTIONS, saved["model"])
                opt.load_state_dict(saved["optimizer"])
                c = opt.engine.controller
                running = None if c.trial is None else [c.trial.current.name, c.trial.in_block]
                saved_at[s].update(steps_after_load=[opt.engine.stats.step, opt.engine.step_calls],
                                   log_after_load=[list(e) for e in opt.engine.measured_log()])
                saved_at[s].update(loaded=_periods(opt), profiling_after_load=c.profiling, running=running,
                                   phase_after_load=c.profiler.phase_step if c.profiler is not None else None)
        idx = _batch(s, rank)
        F.cross_entropy(model(xs[idx]), ys[idx]).backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    trial = opt.engine.controller.trial
    return {"params": params_of(model.module), "plan": opt.engine.plan.fingerprint, "overlap": opt.engine.overlap,
            "trial": opt.engine.stats.extra.get("overlap_trial"), "settled": opt.engine.controller.settled(),
            "trial_at": None if trial is None else [trial.block, trial.in_block], "saved_at": saved_at}


def _spy_profiles(calls: list) -> None:
    """Record what each profile is built from (the module uses' first-use times, the timed steps)."""
    from caramel.strategies.caramel import profiling

    build, split = profiling.build_profile, profiling.add_split_backward

    def spy(name, batch, model, tracker, samples, meta=None):
        calls.append({"first_use": dict(tracker.first_use), "samples": [dataclasses.asdict(x) for x in samples]})
        return build(name, batch, model, tracker, samples, meta=meta)

    def spy_split(profile, model, weight_s, kept, input_bytes):
        names = {m: n for n, m in model.named_modules()}
        calls[-1].update(weight_s={names[m]: v for m, v in weight_s.items()}, kept={names[m]: v for m, v in kept.items()})
        return split(profile, model, weight_s, kept, input_bytes)
    profiling.build_profile, profiling.add_split_backward = spy, spy_split


def trial_resume_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    built: list[dict] = []
    _spy_profiles(built)
    full = _run(rank, PROFILING_AT + RESUME_AT)
    full_profile = built[:]
    profiled = _run(rank, PROFILING_AT, full["saved_at"][PROFILING_AT[0]]["saved"], steps=PROFILING_AT[-1] + 2)
    resumed = _run(rank, RESUME_AT, full["saved_at"][RESUME_AT[0]]["saved"])
    # the profiling arm's second checkpoint holds the timed step it ran itself after the first
    carried = profiled["saved_at"][PROFILING_AT[1]]["saved"]["optimizer"]["caramel_adaptive"]["profiling"]["ranks"]
    entries = {s: profiled["saved_at"][s]["saved"]["optimizer"]["caramel_adaptive"]["profiling"] for s in PROFILING_AT}
    out_profiling = {"full_built": full_profile, "resumed_built": built[len(full_profile):],
                     "carried_split": {k: carried[rank][k] for k in ("weight_s", "kept")},
                     "entry_steps": {s: [e["engine_steps"], e["step_calls"]] for s, e in entries.items()},
                     "after_load": {s: {k: profiled["saved_at"][s][k] for k in ("steps_after_load", "log_after_load")}
                                    for s in PROFILING_AT},
                     "carried_log": {s: e["ranks"][rank]["log"] for s, e in entries.items()},
                     "carried_samples": carried[rank]["samples"], "resumed_trial_at": profiled["trial_at"],
                     "loaded": {s: {k: profiled["saved_at"][s][k] for k in ("profiling_after_load", "phase_after_load")}
                                for s in PROFILING_AT}}
    out = {"full_trial": full["trial"], "resumed_trial": resumed["trial"], "settled": [full["settled"], resumed["settled"]],
           "same_plan": full["plan"] == resumed["plan"] and full["overlap"] == resumed["overlap"],
           "same_params": all(torch.equal(a, b) for a, b in zip(full["params"], resumed["params"])),
           "carried": {}, "entries": {}, "profiling": out_profiling}
    for s in RESUME_AT:
        f, r = full["saved_at"][s], resumed["saved_at"][s]
        entry = f["saved"]["optimizer"]["caramel_adaptive"].get("trial")
        out["entries"][s] = None if entry is None else {k: entry[k] for k in ("block", "in_block", "passes")}
        out["carried"][s] = {"full": f["periods"], "loaded": r["loaded"], "profiling_after_load": r["profiling_after_load"],
                             "selection": entry is not None and entry["selection"] is not None,
                             "running": r.get("running")}
    # a checkpoint's trial is not carried into a run with other options, nor when a rank's own
    # periods are missing (rank 1 loading rank 0's state): no rank adopts, the engine profiles again
    saved = full["saved_at"][RESUME_AT[0]]["saved"]
    refused = {}
    for name, options, state in (("options", {**OPTIONS, "compression": "topk:0.2"}, saved["optimizer"]),
                                 ("one_rank", OPTIONS, _only_rank0(saved["optimizer"]))):
        model, opt = _build(options, saved["model"])
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            opt.load_state_dict(state)
        refused[name] = {"profiling": opt.engine.controller.profiling, "trial": opt.engine.controller.trial is not None,
                         "said": said.getvalue()}
    out["refused"] = refused
    out["per_rank"] = _per_rank_loads(rank, full["saved_at"][PROFILING_AT[1]]["saved"], saved)
    out["ddp"] = ddp_handover_arm(rank)
    return out


def _only_rank0(state: dict) -> dict:
    """The optimizer state with no trial periods but rank 0's, as if rank 0's state dict were
    loaded by every rank (each rank's own state dict holds its own periods alone)."""
    adaptive = state["caramel_adaptive"]
    ranks = {r: own for r, own in adaptive["trial"]["ranks"].items() if int(r) == 0}
    trial = {**adaptive["trial"], "ranks": ranks}
    return {**state, "caramel_adaptive": {**adaptive, "trial": trial}}


DDP_OPTIONS = {"overlap": "auto", "profile_steps": 2, "trial_steps": 2, "trial_passes": 1}
DDP_AT, DDP_STEPS = 7, 14  # the trial: caramel/forward 4-5, caramel/backward 6-7, DDP's 8-11, caramel/backward 12-13


def _tiny(model_state: dict | None):
    # small enough that the planner's backward plan and DDP's schedule (fifo) coincide
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10))
    if model_state is not None:
        m.load_state_dict(model_state)
    return caramel.parallelize(m, torch.optim.SGD(m.parameters(), lr=0.05), **DDP_OPTIONS)


def ddp_handover_arm(rank: int) -> dict:
    """Who runs each step of the trial from `DDP_AT` on (the candidate, whether torch DDP has the
    gradients), uninterrupted and resumed from a checkpoint before `DDP_AT`."""
    xs, ys = _dataset()
    runs = {}
    for arm in ("full", "resumed"):
        model, opt = _tiny(None)
        seen = []
        for s in range(DDP_STEPS):
            if s == DDP_AT:
                trial = opt.engine.controller.trial
                plans = {k.name: k.plan.fingerprint for k in trial.candidates}
                if arm == "resumed":
                    saved = _roundtrip({"model": model.module.state_dict(), "optimizer": opt.state_dict()})
                    model, opt = _tiny(saved["model"])
                    opt.load_state_dict(saved["optimizer"])
            trial = opt.engine.controller.trial
            if s >= DDP_AT and trial is not None:  # who runs step s
                seen.append([s, trial.current.name, opt.engine.delegating])
            idx = _batch(s, rank)
            F.cross_entropy(model(xs[idx]), ys[idx]).backward()
            opt.step()
            opt.zero_grad()
        opt.synchronize()
        runs[arm] = seen
    return {**runs, "plans": plans}


def _per_rank_loads(rank: int, profiling: dict, trial: dict) -> dict:
    """Each rank loads a state dict holding its own part alone (as per-rank files do): rank 1's
    part malformed (its timed step lacks backward_s; its trial periods are not numbers), or its
    shared part from another step. Every rank must take the same decision: all raise, all refuse."""
    cases = {
        "bad_samples": (profiling, "profiling", lambda e: {**e, "ranks": {r: {**own, "samples": [{"forward_s": 0.1}]}
                                                                         for r, own in e["ranks"].items()}}),
        "bad_periods": (trial, "trial", lambda e: {**e, "ranks": {r: {"blocks_s": [[["x"]] for _ in own["blocks_s"]]}
                                                                   for r, own in e["ranks"].items()}}),
        "other_step": (profiling, "profiling", lambda e: {**e, "engine_steps": e["engine_steps"] + 1}),
    }
    out = {}
    for name, (saved, key, spoil) in cases.items():
        adaptive = saved["optimizer"]["caramel_adaptive"]
        entry = {**adaptive[key], "ranks": {r: own for r, own in adaptive[key]["ranks"].items() if int(r) == rank}}
        if rank == 1:
            entry = spoil(entry)
        model, opt = _build(OPTIONS, saved["model"])
        said, raised = io.StringIO(), None
        with contextlib.redirect_stdout(said):
            try:
                opt.load_state_dict({**saved["optimizer"], "caramel_adaptive": {**adaptive, key: entry}})
            except caramel.CaramelError as e:
                raised = str(e)
        c = opt.engine.controller
        out[name] = {"raised": raised, "said": said.getvalue(), "carried": c.trial is not None or (
            c.profiler is not None and c.profiler.phase_step > 0)}
    return out
