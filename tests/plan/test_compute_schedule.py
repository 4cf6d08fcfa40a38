"""Deferred weight gradients, offline: the schedule, the profile it produces (hand-computed), memory,
and the Plan's field."""
import dataclasses
import json

import pytest

from caramel.errors import CaramelError, FormatError
from caramel.plan.compute_schedule import (ComputeSchedule, candidate_ks, check_compute_schedule, deferrable_modules,
                                           deferred_profile, deferred_profile_reference, extra_bytes, max_k,
                                           memory_cap_bytes, schedule_for, undeferred_peak_bytes)
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo, ready_orders
from caramel.sim.synthetic import synthetic_profile, with_split_backward
from caramel.strategies.planners import make_plan


def _param(i, name, nbytes, ready, use_order):
    return ParamInfo(index=i, name=name, shape=[nbytes // 4], dtype="float32", numel=nbytes // 4, bytes=nbytes,
                     requires_grad=True, ready_time_s=ready, first_use_order=use_order,
                     first_use_time_s=float(use_order), use_modules=[])


def small_profile() -> ModelProfile:
    """emb (Embedding) -> norm (LayerNorm) -> fc1 (Linear, weight + bias) -> fc2 (Linear).

    Backward (s): fc2 4, fc1 3, norm 1, emb 2; ready at 4, 7, 8, 10; 0.5 s more after the last.
    Splits (input, weight): emb (0.5, 1.5), fc1 (1, 2), fc2 (3, 1)."""
    params = [_param(0, "emb.weight", 400, 10.0, 0), _param(1, "norm.weight", 40, 8.0, 1),
              _param(2, "fc1.weight", 800, 7.0, 2), _param(3, "fc1.bias", 40, 7.0, 2), _param(4, "fc2.weight", 800, 4.0, 3)]
    mod = lambda name, typ, start, bwd, ps, split=None, db=None: ModuleInfo(  # noqa: E731
        name=name, type=typ, forward_start_s=start, forward_time_s=1.0, backward_time_s=bwd, params=ps,
        splittable=split is not None, input_grad_time_s=split[0] if split else None,
        weight_grad_time_s=split[1] if split else None, deferred_bytes=db, input_bytes=100)
    modules = [mod("emb", "Embedding", 0.0, 2.0, [0], (0.5, 1.5), 300), mod("norm", "LayerNorm", 1.0, 1.0, [1]),
               mod("fc1", "Linear", 2.0, 3.0, [2, 3], (1.0, 2.0), 500), mod("fc2", "Linear", 3.0, 4.0, [4], (3.0, 1.0), 700)]
    return ModelProfile("small", 1, 4.0, 10.5, 0.1, params, modules)


def _orders(prof):
    """Ready orders from the ready times, as the profiler sets them."""
    orders = ready_orders({p.index: p.ready_time_s for p in prof.params})
    for p in prof.params:
        p.ready_order = orders[p.index]
    return prof


def _ready(prof):
    return [p.ready_time_s for p in prof.params]


@pytest.mark.parametrize("k, schedule, ready", [
    (0, [], [10.0, 8.0, 7.0, 7.0, 4.0]),
    # only the first module: its weight gradient was already last, nothing moves
    (1, ["emb"], [10.0, 8.0, 7.0, 7.0, 4.0]),
    # region emb..fc1 from T0 = 10 - 6 = 4: fc1 input 5, norm 6, emb input 6.5, emb weight 8, fc1 weight 10
    (2, ["emb", "fc1"], [8.0, 6.0, 10.0, 10.0, 4.0]),
    # everything from T0 = 0: fc2 in 3, fc1 in 4, norm 5, emb in 5.5; weights emb 7, fc1 9, fc2 10
    (3, ["emb", "fc1", "fc2"], [7.0, 5.0, 9.0, 9.0, 10.0]),
])
def test_deferred_ready_times_by_hand(k, schedule, ready):
    prof = _orders(small_profile())
    before = _ready(prof)
    sched = schedule_for(prof, k)
    assert sched.k == k and sched.modules == schedule
    out = deferred_profile(prof, sched)
    assert _ready(out) == pytest.approx(ready)
    assert _ready(prof) == before  # the input is not changed
    assert out.backward_time_s == prof.backward_time_s and out.forward_time_s == prof.forward_time_s
    ref = deferred_profile_reference(prof, sched)
    assert _ready(ref) == pytest.approx(ready)
    assert [p.ready_order for p in out.params] == [p.ready_order for p in ref.params]
    if k == 3:  # ready order by time; the tie of fc1's weight and bias goes to the later-registered one
        assert [p.ready_order for p in out.params] == [1, 0, 3, 2, 4]


def test_a_tied_embedding_is_never_deferred_nor_moved():
    prof = _orders(small_profile())
    prof.params[0].ready_time_s, prof.params[0].rows_ready_time_s = 0.5, 10.0  # the head's part early, rows last
    assert [prof.modules[m].name for m in deferrable_modules(prof)] == ["fc1", "fc2"]
    sched = schedule_for(prof, 1)
    assert sched.modules == ["fc1"]
    out = deferred_profile(prof, sched)
    # region emb..fc1 from T0 = 10 (the rows) - 6: fc1 in 5, norm 6, emb whole 8, fc1 weight 10
    assert _ready(out) == pytest.approx([0.5, 6.0, 10.0, 10.0, 4.0])
    assert out.params[0].rows_ready_time_s == 10.0
    assert _ready(deferred_profile_reference(prof, sched)) == pytest.approx(_ready(out))
    with pytest.raises(CaramelError, match="tied embedding"):
        deferred_profile(prof, ComputeSchedule(1, ["emb"]))


def test_transform_matches_the_reference_on_a_chain():
    prof = with_split_backward(synthetic_profile(40), weight_share=0.3)
    for k in range(0, 41, 7):
        sched = schedule_for(prof, k)
        a, b = deferred_profile(prof, sched), deferred_profile_reference(prof, sched)
        assert _ready(a) == pytest.approx(_ready(b), abs=1e-12)
        assert [p.ready_order for p in a.params] == [p.ready_order for p in b.params]
        assert max(_ready(a)) == pytest.approx(max(_ready(prof)))  # backward ends when it did
    # deferring all: the first layer's gradient is ready after every input gradient (70% of
    # backward) and its own weight gradient, not when backward ends
    full = deferred_profile(prof, schedule_for(prof, 40))
    assert full.params[0].ready_time_s == pytest.approx(0.7 * 0.06 + 0.3 * prof.modules[0].backward_time_s)


def test_deferring_a_deferred_profile_again():
    prof = _orders(small_profile())
    sched = schedule_for(prof, 2)
    out = deferred_profile(prof, sched)
    assert deferred_profile(out, sched) is out  # the simulator may be handed either
    with pytest.raises(CaramelError, match="already deferred"):
        deferred_profile(out, schedule_for(prof, 3))


def test_bad_schedules_name_the_problem():
    prof = _orders(small_profile())
    with pytest.raises(CaramelError, match="compute_schedule=4 asks to defer 4 modules.*has 3 splittable"):
        schedule_for(prof, 4)
    with pytest.raises(CaramelError, match="does not have"):
        deferred_profile(prof, ComputeSchedule(1, ["nope"]))
    with pytest.raises(CaramelError, match="not splittable"):
        deferred_profile(prof, ComputeSchedule(1, ["norm"]))
    for bad in ("sometimes", -1, True, 2.0, None):
        with pytest.raises(CaramelError, match="compute_schedule must be"):
            check_compute_schedule(bad)
    assert check_compute_schedule("auto") == "auto" and check_compute_schedule(3) == 3


def test_memory_estimate_and_cap():
    prof = _orders(small_profile())
    # params 2080 + grads 2080 + inputs 4 x 100
    assert undeferred_peak_bytes(prof) == 2080 * 2 + 400
    assert memory_cap_bytes(prof) == 456 and memory_cap_bytes(prof, 0.5) == 2280
    assert extra_bytes(prof, schedule_for(prof, 2)) == 800 == schedule_for(prof, 2).extra_bytes
    assert max_k(prof) == 1  # emb's 300 fits 456, emb + fc1's 800 does not
    assert max_k(prof, cap_bytes=10_000) == 3 and max_k(prof, cap_bytes=0) == 0
    old = dataclasses.replace(prof, modules=[dataclasses.replace(m, splittable=False, input_grad_time_s=None,
                                                                  weight_grad_time_s=None, deferred_bytes=None,
                                                                  input_bytes=None) for m in prof.modules])
    assert deferrable_modules(old) == [] and max_k(old) == 0 and undeferred_peak_bytes(old) == 4160


def test_candidate_ks_are_few():
    assert candidate_ks(0) == [0]
    assert candidate_ks(1) == [0, 1]
    assert candidate_ks(6) == [0, 1, 2, 4, 6]
    assert candidate_ks(200) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 200]


def test_old_profile_files_load_without_the_new_fields():
    d = _orders(small_profile()).to_dict()
    for m in d["modules"]:
        for key in ("splittable", "input_grad_time_s", "weight_grad_time_s", "deferred_bytes", "input_bytes"):
            del m[key]
    prof = ModelProfile.from_dict(json.loads(json.dumps(d)))
    assert all(not m.splittable and m.weight_grad_time_s is None and m.deferred_bytes is None for m in prof.modules)
    again = ModelProfile.from_dict(json.loads(json.dumps(_orders(small_profile()).to_dict())))
    assert again.modules[0].weight_grad_time_s == 1.5 and again.modules[0].splittable


def test_plan_round_trip_and_fingerprints():
    prof = _orders(small_profile())
    plain = make_plan("fifo", prof)
    forced = make_plan("fifo", prof, compute_schedule=2)
    assert plain.compute_schedule is None
    assert forced.compute_schedule == ComputeSchedule(2, ["emb", "fc1"], 800)
    d = forced.to_dict()
    assert d["compute_schedule"] == {"k": 2, "modules": ["emb", "fc1"], "extra_bytes": 800}
    back = Plan.from_dict(json.loads(json.dumps(d)))
    assert back.compute_schedule == forced.compute_schedule and back.fingerprint == forced.fingerprint
    # same buckets and order, another schedule: another fingerprint; none: the fingerprint as before
    other = dataclasses.replace(forced, compute_schedule=None)
    assert other.fingerprint != forced.fingerprint
    # a plan file from before the field: loads, same fingerprint
    old = plain.to_dict()
    del old["compute_schedule"]
    loaded = Plan.from_dict(json.loads(json.dumps(old)))
    assert loaded.compute_schedule is None and loaded.fingerprint == plain.fingerprint == old["fingerprint"]
    # an empty schedule is no schedule
    assert dataclasses.replace(plain, compute_schedule=ComputeSchedule(0)).compute_schedule is None
    bad = dict(d, compute_schedule={"k": 1, "modules": "emb"})
    with pytest.raises(FormatError, match="compute_schedule"):
        Plan.from_dict(bad)


def test_an_old_plan_keeps_its_fingerprint():
    """A fingerprint computed before this field existed (hash of world_size, model, buckets, order)."""
    import hashlib
    prof = _orders(small_profile())
    plan = make_plan("fifo", prof, world_size=2)
    core = {"world_size": 2, "model_fingerprint": plan.model_fingerprint,
            "buckets": [[b.params, b.dtype, b.numel, b.num_chunks] for b in plan.buckets],
            "order": [list(o) for o in plan.order]}
    assert plan.fingerprint == hashlib.sha256(json.dumps(core, separators=(",", ":")).encode()).hexdigest()[:16]
