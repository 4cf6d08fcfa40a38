"""The planners and the caramel strategy's simulator with `compute_schedule`: auto chooses a deferral
where the first layer's window is the bottleneck and none where compute is; forced k is honored."""
import pytest

from caramel.errors import CaramelError
from caramel.plan.compute_schedule import deferred_profile, schedule_for
from caramel.sim.simulate import simulate
from caramel.sim.synthetic import synthetic_profile, with_split_backward
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.caramel.simulate import simulate_caramel
from caramel.strategies.options import build_options, parse_spec
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec

MB = 1 << 20


def first_layer_heavy():
    """A large first layer (needed first in the next forward, ready last in backward) and 7 small ones."""
    prof = synthetic_profile(sizes_bytes=[4 * MB] + [MB // 4] * 7, times_s=[1] * 8, forward_time_s=0.02,
                             backward_time_s=0.04)
    return with_split_backward(prof, weight_share=0.5, activation_bytes=1024)


def test_auto_defers_when_the_first_layers_window_is_the_bottleneck():
    prof = first_layer_heavy()
    cluster = ClusterSpec.uniform(4, 1e9, 50e-6)  # comm-bound: the first bucket is waited on
    plan = make_plan("caramel", prof, cluster)
    off = make_plan("caramel", prof, cluster, compute_schedule="off")
    decision = plan.options["compute_schedule"]
    assert decision["mode"] == "auto" and decision["k_max"] == 8 and decision["candidates"] == [0, 1, 2, 4, 8]
    assert decision["chosen"] > 0 and plan.compute_schedule is not None
    assert plan.compute_schedule.k == decision["chosen"]
    assert plan.compute_schedule.modules == [f"layer{i}" for i in range(plan.compute_schedule.k)]
    assert plan.predicted_step_time_s < 0.95 * off.predicted_step_time_s
    assert off.compute_schedule is None and off.options["compute_schedule"] == {"mode": "off"}
    # the prediction is the simulator's for the measured profile and the plan (which defers)
    again = simulate(prof, cluster, plan, overlap="forward", trace=False)
    assert again.step_time_s == pytest.approx(plan.predicted_step_time_s)


def test_auto_keeps_k0_when_compute_bound():
    prof = first_layer_heavy()
    plan = make_plan("caramel", prof, ClusterSpec.uniform(4, 1e12, 1e-6))
    assert plan.options["compute_schedule"]["chosen"] == 0 and plan.compute_schedule is None


def test_auto_respects_the_memory_cap():
    prof = with_split_backward(first_layer_heavy(), weight_share=0.5, activation_bytes=400 * 1024)
    plan = make_plan("caramel", prof, ClusterSpec.uniform(4, 1e9, 50e-6), input_spread=0)
    decision = plan.options["compute_schedule"]
    # cap: 10% of (2 x 5.75 MiB of parameters and gradients + 8 x 400 KiB of inputs) fits one 800 KiB deferral
    assert decision["k_max"] == 1 and decision["chosen"] <= 1


def test_defer_memory_fraction_moves_the_cap():
    prof = with_split_backward(first_layer_heavy(), weight_share=0.5, activation_bytes=400 * 1024)
    cluster = ClusterSpec.uniform(4, 1e9, 50e-6)
    tight = make_plan("caramel", prof, cluster, input_spread=0, defer_memory_fraction=0)
    loose = make_plan("caramel", prof, cluster, input_spread=0, defer_memory_fraction=1.0)
    assert tight.options["compute_schedule"]["k_max"] == 0 and tight.compute_schedule is None
    assert loose.options["compute_schedule"]["k_max"] == 8
    assert tight.options["compute_schedule"]["memory_cap_bytes"] == 0
    opts = build_options(CaramelOptions, parse_spec("caramel:defer_memory_fraction=0.5")[1])
    assert opts.planner_options() == {"defer_memory_fraction": 0.5}
    for bad in (-0.1, "lots"):
        with pytest.raises(CaramelError, match="defer_memory_fraction"):
            build_options(CaramelOptions, {"defer_memory_fraction": bad})


def test_a_profile_without_split_timings_plans_as_before():
    prof = synthetic_profile(sizes_bytes=[4 * MB] + [MB // 4] * 7, times_s=[1] * 8)
    cluster = ClusterSpec.uniform(4, 1e9, 50e-6)
    plan = make_plan("caramel", prof, cluster, input_spread=0)
    assert plan.compute_schedule is None and plan.options["compute_schedule"]["k_max"] == 0
    assert plan.fingerprint == make_plan("caramel", prof, cluster, input_spread=0, compute_schedule="off").fingerprint


@pytest.mark.parametrize("planner", ["caramel", "fifo", "fusion"])
def test_forced_k_is_honored_by_every_planner(planner):
    prof = first_layer_heavy()
    cluster = ClusterSpec.uniform(4, 1e9, 50e-6)
    extra = {"input_spread": 0} if planner == "caramel" else {}
    plan = make_plan(planner, prof, cluster, compute_schedule=2, **extra)
    assert plan.compute_schedule.k == 2 and plan.compute_schedule.modules == ["layer0", "layer1"]
    assert plan.compute_schedule.extra_bytes == 2 * 2 * 1024
    # buckets follow the deferred ready order: the ready times they carry are the deferred ones
    deferred = deferred_profile(prof, schedule_for(prof, 2))
    for b in plan.buckets:
        assert b.ready_time_s == pytest.approx(max(deferred.params[i].ready_time_s for i in b.params))
    if planner != "caramel":  # fifo and fusion never choose one themselves
        assert make_plan(planner, prof, cluster).compute_schedule is None


@pytest.mark.parametrize("planner", ["caramel", "fifo", "fusion"])
@pytest.mark.parametrize("value, message", [
    ("sometimes", "compute_schedule must be 'auto'"), (-1, "compute_schedule must be 'auto'"),
    (9, "compute_schedule=9 asks to defer 9 modules.*has 8 splittable"),
])
def test_bad_values_are_one_clear_error(planner, value, message):
    with pytest.raises(CaramelError, match=message):
        make_plan(planner, first_layer_heavy(), ClusterSpec.uniform(2, 1e9, 50e-6), compute_schedule=value,
                  **({"input_spread": 0} if planner == "caramel" else {}))


def test_the_strategy_simulator_passes_compute_schedule():
    prof = first_layer_heavy()
    cluster = ClusterSpec.uniform(4, 1e9, 50e-6)
    _, values = parse_spec("caramel:compute_schedule=2,overlap=forward,input_spread=0")
    forced = simulate_caramel(prof, cluster, build_options(CaramelOptions, values))
    plan = make_plan("caramel", prof, cluster, overlap="forward", input_spread=0, compute_schedule=2)
    assert forced.step_time_s == pytest.approx(simulate(prof, cluster, plan, trace=False).step_time_s)
    _, values = parse_spec("caramel:planner=fifo,compute_schedule=8,overlap=forward")
    fifo = simulate_caramel(prof, cluster, build_options(CaramelOptions, values))
    fifo_plan = make_plan("fifo", prof, cluster, compute_schedule=8)
    assert fifo.step_time_s == pytest.approx(simulate(prof, cluster, fifo_plan, trace=False).step_time_s)
    off = simulate_caramel(prof, cluster, build_options(CaramelOptions, {"planner": "fifo", "overlap": "forward"}))
    assert fifo.step_time_s < off.step_time_s  # the first layer's gradient goes earlier
