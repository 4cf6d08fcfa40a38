"""A checkpoint taken during the online profiling or the overlap trial carries them: a run
resumed during profiling goes on at the saved phase with the saved measurements and plans at the
step the run never stopped did; a run resumed from one in the trial's second block, and again
from one in its confirmation, finishes the trial as the run never stopped does, with the same periods carried, the same decision (less
the first resumed step's period: a fresh process has none) and, with top-k (per-bucket entries), the same
parameters bit for bit (2-rank gloo, `trial_resume_workers`; the trial reads
a fake clock, so the decision is forced the same in both runs). An entry for other options, or
without a rank's own periods, is adopted by no rank; a malformed or newer one is one error."""
import re

import pytest
import torch

from caramel.testing import run_workers
from tests.strategies.caramel.trial_resume_workers import PROFILING_AT, RESUME_AT

torch.set_num_threads(1)


@pytest.mark.timeout(200)
def test_a_checkpoint_mid_profiling_or_trial_resumes_to_the_same_decisions():
    from tests.strategies.caramel.trial_resume_workers import trial_resume_worker
    for rank, r in enumerate(run_workers(trial_resume_worker, 2, timeout_s=160)):
        full, resumed = r["full_trial"], r["resumed_trial"]
        assert full is not None and full["confirmation"] is not None and full["confirmation"]["confirmed"], full
        _same_decision_one_period_less(full, resumed, r["carried"][RESUME_AT[0]]["running"])
        assert r["settled"] == [True, True]
        # the blocks as run, the engine's step counts: the trial's steps 5-12 and the confirmation's
        # 13-20 (steps 4-19 from 0), contiguous; the resumed run's record, carried through both
        # checkpoints, is the same (compared in `_same_decision_one_period_less`)
        blocks = full["blocks"]
        assert [b[2] - b[1] + 1 for b in blocks] == [2, 4, 2, 2, 4, 2], blocks
        assert full["start_step"] == blocks[0][1] == 5 and full["end_step"] == blocks[-1][2] == 20, full
        assert all(b[1] == a[2] + 1 for a, b in zip(blocks, blocks[1:])), blocks
        assert r["same_plan"] and r["same_params"], r
        first, second = (r["carried"][s] for s in RESUME_AT)
        assert r["entries"][RESUME_AT[0]] == {"block": 1, "in_block": 1, "passes": 1}, r["entries"]
        assert not first["selection"] and second["selection"], r["carried"]  # the second is in the confirmation
        for s in RESUME_AT:
            c = r["carried"][s]
            assert c["profiling_after_load"] is False and c["full"] and c["loaded"] == c["full"], (s, c)
        p = r["profiling"]  # the profiling arm: resumed before the split step, then after one timed step
        assert p["loaded"] == {s: {"profiling_after_load": True, "phase_after_load": s} for s in PROFILING_AT}, p["loaded"]
        (full_built,), (resumed_built,) = p["full_built"], p["resumed_built"]
        assert len(full_built["samples"]) == len(resumed_built["samples"]) == 2
        assert resumed_built["first_use"] == full_built["first_use"]  # the uses the full run saw at step 0
        assert resumed_built["samples"][0] == p["carried_samples"][0]  # timed before the second resume
        # the split step's timings: run by the resumed arm at step 1, carried at step 3, planned from
        full_split = {k: full_built[k] for k in ("weight_s", "kept")}
        assert full_split["weight_s"] and full_split["weight_s"].keys() == p["carried_split"]["weight_s"].keys(), p
        assert {k: resumed_built[k] for k in ("weight_s", "kept")} == p["carried_split"], (resumed_built, p)
        assert p["carried_split"]["kept"] == full_split["kept"], (p["carried_split"], full_split)
        for s in PROFILING_AT:
            after, log = p["after_load"][s], p["carried_log"][s]
            assert p["entry_steps"][s] == [s, s] and after["steps_after_load"] == [s, s], (s, p["entry_steps"], after)
            # the carried collectives come first, shifted in time alone: same bytes, same durations
            assert log and len(after["log_after_load"]) >= len(log), (s, len(log), after)
            assert all(n == m and abs((d - i) - (e - j)) < 1e-6
                       for (i, d, n), (j, e, m) in zip(log, after["log_after_load"])), (s, log, after)
        assert p["resumed_trial_at"] == [0, 1]  # the plan came after step 3, as in the full run: the trial runs
        ddp = r["ddp"]  # DDP's schedule and the planner's backward plan coincide: still told apart
        assert ddp["plans"]["caramel/backward"] == ddp["plans"]["fifo/backward"], ddp["plans"]
        assert ddp["resumed"] == ddp["full"] and [7, "caramel/backward", False] in ddp["full"], ddp
        assert [8, "fifo/backward", True] in ddp["full"] and [12, "caramel/backward", False] in ddp["full"], ddp
        per_rank = r["per_rank"]  # rank 1's own part bad, or from another step: every rank alike
        for case, field in (("bad_samples", "malformed samples of rank 1"), ("bad_periods", "rank 1's periods")):
            assert per_rank[case]["raised"] and field in per_rank[case]["raised"], (case, per_rank[case])
            assert "(found by rank 1)" in per_rank[case]["raised"], (case, per_rank[case])
        assert per_rank["other_step"]["raised"] is None and not per_rank["other_step"]["carried"], per_rank
        if rank == 0:
            assert "differ in what every rank must hold alike" in per_rank["other_step"]["said"], per_rank
        refused = r["refused"]
        for case in ("options", "one_rank"):
            assert refused[case]["profiling"] and not refused[case]["trial"], (case, refused[case])
        if rank == 0:
            assert "topk:0.1" in refused["options"]["said"] and "chosen again" in refused["options"]["said"], refused
            assert "no step periods of this rank" in refused["one_rank"]["said"] and "(rank 1)" in refused["one_rank"]["said"]


def _same_decision_one_period_less(full: dict, resumed: dict, running: list) -> None:
    """The resumed trial decides as the full one. Its first step after each resume (inside a
    block) has no period, a fresh process's first: not counted, so the candidate running then
    counts one step less (the first resume's is in the passes' count, the second's in the
    confirmation's) and no made-up 0 s period pulls a median down."""
    name, in_block = running
    assert in_block >= 1, running
    for k in ("chosen", "fastest", "baseline", "passes", "paired", "predicted_step_time_s", "start_step", "end_step",
              "blocks"):
        assert resumed[k] == full[k], (k, resumed, full)
    assert resumed["steps_counted"] == {**full["steps_counted"], name: full["steps_counted"][name] - 1}, (resumed, full)
    for k in ("candidate", "confirmed", "paired"):
        assert resumed["confirmation"][k] == full["confirmation"][k], (k, resumed, full)
    # the fake clock's periods of a candidate differ by 0.8 ms at most
    for got, want in ((resumed["step_period_s"], full["step_period_s"]),
                      (resumed["confirmation"]["step_period_s"], full["confirmation"]["step_period_s"])):
        assert got.keys() == want.keys() and all(abs(got[n] - want[n]) <= 0.0008 for n in want), (got, want)


def test_a_bad_newer_or_unfit_trial_entry():
    from types import SimpleNamespace

    from caramel.errors import CaramelError
    from caramel.strategies.caramel.trial_state import _REQUIRED, _unfit, check_entry, restore_trial

    c = SimpleNamespace(balancer=None, world=2, rank=0, fingerprint="f", plan_inputs={"compression": "topk:0.1"}, trial_steps=2,
                        trial_passes=1)
    with pytest.raises(CaramelError, match="'trial' must be a mapping, got list"):
        restore_trial(SimpleNamespace(**{**vars(c), "world": 1}), [])
    with pytest.raises(CaramelError, match="version 2, newer than this caramel reads"):
        check_entry({"version": 2})
    with pytest.raises(CaramelError, match="version '1', expected an integer from 1 to 1"):
        check_entry({"version": "1"})
    with pytest.raises(CaramelError, match="lacks world, candidates, preference"):
        check_entry({"version": 1})
    plan = {"world_size": 2, "model_fingerprint": "f"}
    good = {**{k: None for k in _REQUIRED}, "version": 1, "world": 2, "inputs": {"compression": "topk:0.1"},
            "preference": ["caramel/backward", "caramel/forward"], "max_passes": 1, "confirm": True, "passes": 1,
            "predicted_s": {"caramel/forward": 0.01, "caramel/backward": None}, "engine_steps": 7, "step_calls": 7,
            "order_replans": 0,
            "candidates": [{"name": "caramel/forward", "overlap": "forward", "plan": plan},
                           {"name": "caramel/backward", "overlap": "backward", "plan": plan}],
            "blocks": [[0, 2], [1, 4], [0, 2]], "block": 1, "in_block": 1, "steps": 2,
            "ranks": {0: {"blocks_s": [[[0.01]], []]}, 1: {"blocks_s": [[[0.02]], []]}}}
    check_entry(good)  # an entry written before the record of the blocks run (`ran`) has none
    check_entry({**good, "ran": [["caramel/forward", 5, 6], ["caramel/backward", 7, 7]]})
    assert _unfit(c, good) is None
    for bad, what in (({"blocks": [[2, 2]]}, "malformed blocks"), ({"in_block": 4}, "malformed block/in_block"),
                      ({"ranks": {0: {"blocks_s": [[]]}}}, "malformed ranks"), ({"steps": 1}, "malformed steps"),
                      ({"candidates": [{"name": "x"}]}, "malformed candidates"),
                      ({"ran": [["caramel/other", 5, 6]]}, "malformed ran")):
        with pytest.raises(CaramelError, match=what):
            check_entry({**good, **bad})
    # a `ran` of the right shape that contradicts the rest of the entry: the broken rule named
    check_entry({**good, "ran": [["caramel/backward", 7, 7]]})  # recorded from a resume inside block 1
    for ran, what in (([["caramel/forward", 9, 2]], "before its first step"),
                      ([["caramel/forward", 5, 6], ["caramel/backward", 100, 100]], "not right after step 6"),
                      ([["caramel/forward", 5, 6], ["caramel/backward", 7, 8]], "has 2 steps, the blocks run 1"),
                      ([["caramel/backward", 5, 6], ["caramel/backward", 7, 7]], "block 0 is 'caramel/backward'"),
                      ([["caramel/forward", 1, 3], ["caramel/backward", 4, 4]], "has 3 steps, the blocks run 2"),
                      ([["caramel/forward", 6, 7], ["caramel/backward", 8, 8]], "after the run's step 7"),
                      ([["caramel/forward", 1, 2]] * 3, "more than the 2 started")):
        with pytest.raises(CaramelError, match="malformed ran .*" + re.escape(what)):
            check_entry({**good, "ran": ran})
    with pytest.raises(CaramelError, match="after the run's step 6"):  # the balancer's count, when given
        check_entry({**good, "ran": [["caramel/forward", 5, 6], ["caramel/backward", 7, 7]]}, last_step=6)
    # every field used later, checked here: one CaramelError naming it, not a TypeError steps later
    for bad, what in (({"block": "1"}, "block/in_block"), ({"in_block": None}, "block/in_block"),
                      ({"blocks": [[0, "2"]]}, "malformed blocks"), ({"blocks": [["0", 2]]}, "malformed blocks"),
                      ({"inputs": ["compression"]}, "malformed inputs"), ({"preference": None}, "malformed preference"),
                      ({"preference": ["caramel/none"]}, "malformed preference"), ({"predicted_s": None}, "predicted_s"),
                      ({"max_passes": 0}, "malformed max_passes"), ({"selection": {"fastest": "x"}}, "malformed selection"),
                      ({"ranks": {0: {"blocks_s": [[["0.01"]], []]}}}, "rank 0's periods"),
                      ({"candidates": [{**good["candidates"][0], "plan_ref": 1}, good["candidates"][1]]}, "plan_ref")):
        with pytest.raises(CaramelError, match=what):
            check_entry({**good, **bad})
    assert _unfit(c, {**good, "world": 4}) == "it was run by 4 workers, this job has 2"
    without_world = {k: v for k, v in good.items() if k != "world"}
    with pytest.raises(CaramelError, match="lacks world; it was not written by caramel"):
        check_entry(without_world)
    with pytest.raises(CaramelError, match=r"malformed world \(1, an integer >= 2\)"):
        check_entry({**good, "world": 1})
    assert _unfit(SimpleNamespace(**{**vars(c), "trial_steps": 5}), good) == "it was run with trial_steps=2 (this run 5)"
    assert _unfit(SimpleNamespace(**{**vars(c), "trial_passes": 3}), good) == "it was run with trial_passes=1 (this run 3)"
    assert _unfit(c, {**good, "inputs": {"compression": "topk:0.2"}}).startswith("it was run with compression='topk:0.2'")
    assert "no step periods of this rank" in _unfit(SimpleNamespace(**{**vars(c), "rank": 1}), {**good, "ranks": {0: good["ranks"][0]}})
    assert _unfit(SimpleNamespace(**{**vars(c), "fingerprint": "g"}), good) == "its plans were made for a model with other parameters"


def test_a_bad_newer_or_unfit_profiling_entry():
    from types import SimpleNamespace

    import torch.nn as nn

    from caramel.errors import CaramelError
    from caramel.strategies.caramel.profiling_state import _OWN, _REQUIRED, _unfit, check_entry

    model = nn.Sequential(nn.Linear(2, 2))
    c = SimpleNamespace(world=2, rank=0, fingerprint="f", plan_inputs={"compression": "topk:0.1"}, profile_steps=2,
                        planner_options={}, model=model)
    sample = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.001, "module_start_s": {"0": 0.0},
              "ready_s": {"0": 0.02}, "rows_ready_s": {}}
    own = {**{k: None for k in _OWN}, "phase_step": 3, "first_use": [[0, "0", 0.0]], "use_modules": [[0, ["0"]]],
           "module_order": ["0"], "weight_s": {"0": 0.001}, "kept": {}, "input_bytes": {"0": 8},
           "sizes_taken": True, "samples": [sample], "log": [[0.5, 0.6, 64]]}
    good = {"version": 1, "world": 2, "inputs": {"compression": "topk:0.1"}, "model_fingerprint": "f",
            "profile_steps": 2, "measure_split": True, "engine_steps": 3, "step_calls": 3, "order_replans": 0,
            "ranks": {0: own, 1: own}}
    assert set(good) - {"version"} == set(_REQUIRED)
    check_entry(good)
    assert _unfit(c, good) is None
    with pytest.raises(CaramelError, match="'profiling' has version 2, newer than this caramel reads"):
        check_entry({**good, "version": 2})
    with pytest.raises(CaramelError, match="lacks world, inputs"):
        check_entry({"version": 1})
    with pytest.raises(CaramelError, match="malformed ranks"):
        check_entry({**good, "ranks": {0: {"phase_step": 1}}})
    with pytest.raises(CaramelError, match="malformed phase_step 4 of rank 0"):
        check_entry({**good, "ranks": {0: {**own, "phase_step": 4}}})
    with pytest.raises(CaramelError, match="malformed phase_step 1 of rank 0"):
        check_entry({**good, "ranks": {0: {**own, "phase_step": 1, "module_order": None}}})
    for bad, what in (({"weight_s": 3}, "malformed weight_s of rank 0"), ({"kept": None}, "malformed kept of rank 0"),
                      ({"samples": [{"forward_s": 0.1}]}, "malformed samples of rank 0"),
                      ({"first_use": [[0, "0"]]}, "malformed first_use of rank 0"),
                      ({"log": [[0.5, "0.6", 64]]}, "malformed log of rank 0")):
        with pytest.raises(CaramelError, match=what):
            check_entry({**good, "ranks": {0: {**own, **bad}, 1: own}})
    with pytest.raises(CaramelError, match="ranks at different phase_steps .rank 0: 2, rank 1: 3."):
        check_entry({**good, "ranks": {0: {**own, "phase_step": 2}, 1: own}})
    with pytest.raises(CaramelError, match="malformed step_calls"):
        check_entry({**good, "step_calls": "3"})
    assert _unfit(c, {**good, "ranks": {0: {**own, "module_order": ["9"]}}}) == "it names modules this model lacks"
    assert _unfit(c, {**good, "profile_steps": 3}) == "it was run with profile_steps=3 (this run 2)"
    assert _unfit(c, {**good, "world": 4}) == "it was run by 4 workers, this job has 2"
    without_world = {k: v for k, v in good.items() if k != "world"}
    with pytest.raises(CaramelError, match="lacks world; it was not written by caramel"):
        check_entry(without_world)
    with pytest.raises(CaramelError, match=r"malformed world \(1, an integer >= 2\)"):
        check_entry({**good, "world": 1})
    assert _unfit(c, {**good, "model_fingerprint": "g"}) == "it was run for a model with other parameters"
    assert "no measurements of this rank" in _unfit(c, {**good, "ranks": {1: own}})
    assert _unfit(c, {**good, "ranks": {0: {**own, "kept": {"1": 4}}}}) == "it names modules this model lacks"


def test_the_trial_entry_carries_each_periods_shares():
    # balance="batch": each rank's local batch size per counted period, its last one and the
    # passes re-timed travel with the periods, so a resumed trial still compares candidates on
    # the latest shares' steps; an entry written before them carries periods of unknown shares
    from types import SimpleNamespace

    import torch.nn as nn

    from caramel.errors import CaramelError
    from caramel.strategies.caramel.profiling import registration_profile
    from caramel.strategies.caramel.trial import Candidate, OverlapTrial
    from caramel.strategies.caramel.trial_state import _parse, check_entry, trial_state
    from caramel.strategies.planners import make_plan

    m = nn.Linear(4, 2)
    names, params = [n for n, _ in m.named_parameters()], list(m.parameters())
    plan = make_plan("fifo", registration_profile(names, params), world_size=2)
    trial = OverlapTrial([Candidate("caramel/forward", "forward", plan), Candidate("caramel/backward", "backward", plan)],
                         steps=2, group=None, world=2, preference=["caramel/backward", "caramel/forward"])
    for step, (p, n) in enumerate([(0.5, 8), (0.02, 8), (0.5, 8), (0.03, 11)], start=1):
        trial.record(p, step=step, n=n)
    trial.retimed, trial.confirm_retimed = 1, True
    balancer = SimpleNamespace(step=4, local_batch=11)
    c = SimpleNamespace(trial=trial, world=2, rank=0, profiling=False, balancer=balancer, profile=None, plan_cluster=None,
                        module_uses=None, plan_inputs={}, checks=SimpleNamespace(order_replans=0), group=None,
                        engine=SimpleNamespace(module_order=lambda: None, stats=SimpleNamespace(step=4), step_calls=4))
    entry = trial_state(c)
    check_entry(entry, last_step=4)
    back, _, _ = _parse(c, entry)
    assert [k.blocks_n for k in back.candidates] == [[[8]], [[11]]] and back.last_n == 11 and back.retimed == 1
    assert back.confirm_retimed is True and back.sized is True  # sized: the resumed run's balancer sets sizes
    assert [k.blocks_s for k in back.candidates] == [[[0.02]], [[0.03]]]
    own = entry["ranks"][0]
    old = {**entry, "ranks": {0: {"blocks_s": own["blocks_s"]}}}
    del old["retimed"], old["confirm_retimed"]
    back, _, _ = _parse(c, old)
    assert [k.blocks_n for k in back.candidates] == [[[None]], [[None]]] and back.last_n is None and back.retimed == 0
    assert back.confirm_retimed is False
    with pytest.raises(CaramelError, match="malformed confirm_retimed"):
        check_entry({**entry, "confirm_retimed": 1})
    for bad in ({"blocks_n": [[[8]], [[11, 12]]]}, {"blocks_n": [[["8"]], [[11]]]}, {"last_n": 0}):
        with pytest.raises(CaramelError, match="rank 0's blocks_n and last_n"):
            check_entry({**entry, "ranks": {0: {**own, **bad}}})
