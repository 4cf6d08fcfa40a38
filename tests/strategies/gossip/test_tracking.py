"""algorithm=tracking (gradient tracking) on 4 gloo workers: the tracking invariant, DDP's step
on the complete graph, exact resume, and clear refusals."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.strategies import STRATEGIES
from caramel.strategies.gossip.options import GossipOptions
from caramel.testing import run_workers
from tests.strategies.gossip.tracking_workers import DIVERGENT_CASES, OVERLAP_CASES, four_worker_suite

pytestmark = pytest.mark.timeout(200)
STEPS = 4


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tracking-traces")


@pytest.fixture(scope="module")
def four(trace_dir):
    return run_workers(four_worker_suite, 4, args=(STEPS, str(trace_dir)), timeout_s=180)


def test_overlapped_trackers_give_the_reference_parameters_bit_for_bit(four):
    """Trackers sent from the gradient hooks, in messages of 8 KB, against every tracker formed
    and sent at step(): the same parameters to the last bit after 12 steps (tracking and
    tracking_momentum; AdamW, SGD with momentum, BatchNorm, a tied embedding, accumulation in
    and outside no_sync())."""
    for res in (r["overlap"] for r in four):
        assert sorted(k for k in res if k != "clipped") == sorted(f"{c[0]}-{c[2]}" for c in OVERLAP_CASES)
        for case in (k for k in res if k != "clipped"):
            r = res[case]
            assert r["steps"] == 3 * STEPS and r["moved"] > 1e-4, (case, r)
            assert r["diff"] == 0.0, (case, r)
            # every message of every step but the first (sent at step(), where the ranks agree on
            # one module order) left in backward; the reference sent none there
            assert r["in_backward"] >= (3 * STEPS - 1) * 2 and r["reference_in_backward"] == 0, (case, r)


def test_a_gradient_edited_after_backward_is_refused_with_overlapped_trackers(four):
    for res in (r["overlap"] for r in four):
        assert "overlap_trackers=false" in res["clipped"] and "changed" in res["clipped"], res["clipped"]


def test_the_simulator_prices_the_bytes_the_runtime_sends_per_link(four, trace_dir):
    """Each traced step's bytes per link (parameters, moments, buffers, trackers), against what
    the simulator prices for a profile of the same model and optimizer."""
    from caramel.profile.profiler import profile_model
    from caramel.strategies.gossip.simulate import simulate_gossip
    from caramel.topology.spec import ClusterSpec
    from caramel.trace.events import Trace
    from tests.distributed.workers import fresh, make_optimizer

    for family, kind, algorithm, _, _, traced in OVERLAP_CASES:
        if not traced:
            continue
        w = fresh(family)
        opt, _ = make_optimizer(kind, w.model.parameters())
        prof = profile_model(w.model, w.inputs, w.targets, w.loss_fn, opt, steps=1, warmup=0)
        priced = simulate_gossip(prof, ClusterSpec.uniform(4, 1e9), GossipOptions(algorithm=algorithm)).meta
        for rank in range(4):
            trace = Trace.load(trace_dir / f"{family}-{algorithm}.rank{rank}.json")
            steps = trace.meta["per_step"]
            assert len(trace.events) == len(steps) == 3 * STEPS
            for ev, step in zip(trace.events, steps):
                assert len(step["peers"]) == 2  # a ring
                assert ev.bytes / 2 == priced["bytes_per_peer_per_step"], (family, algorithm, ev.bytes, priced)
                assert step["tracker_bytes_per_peer"] == priced["tracker_bytes_per_peer_per_step"]


def test_the_trackers_sum_is_the_gradients_sum_at_every_step(four):
    for res in (r["invariant"] for r in four):
        assert len(res["sum_gap"]) == STEPS
        for gap, scale, from_mean, from_own in zip(res["sum_gap"], res["scale"], res["from_mean"], res["from_own"]):
            assert gap <= 1e-12 * scale, (gap, scale)
            # on a ring a tracker is neither the average gradient nor the worker's own
            assert from_mean > 1e-6 * scale and from_own > 1e-6 * scale, (from_mean, from_own, scale)
        assert all(res["grads_kept"])  # after step() p.grad is the worker's own gradient again
        assert res["skipped_unused"]  # no gradient anywhere: no update, no weight decay
        assert res["bytes_per_peer"] == 2 * res["param_bytes"]  # parameters + trackers


def test_complete_graph_tracking_takes_ddps_adamw_step(four):
    for res in (r["complete"] for r in four):
        for algorithm in ("tracking", "tracking_momentum"):
            assert res[algorithm]["moved"] > 1e-3
            assert res[algorithm]["ddp"] <= 1e-6, (algorithm, res[algorithm])
        # parameters + trackers, and AdamW's two moments on top
        assert res["tracking"]["bytes"] == 2 * res["dpsgd"]["bytes"]
        assert res["tracking_momentum"]["bytes"] == 4 * res["dpsgd"]["bytes"]
        assert res["dpsgd"]["ddp"] > 1e-4, res["dpsgd"]  # local Adam moments: the test can tell


def test_tracking_resumes_exactly(four):
    for res in (r["checkpoint"] for r in four):
        assert res["diff"] == 0.0


def test_a_closure_and_a_state_without_tracker_are_refused(four):
    for res in (r["refusals"] for r in four):
        assert "algorithm=tracking" in res["closure"] and "closure" in res["closure"]
        assert "has none" in res["state"] and "tracker" in res["state"]


def test_a_childs_tensors_its_parent_uses_are_mixed_before_the_parent_runs(four):
    # tracking_momentum's moments double the messages; any algorithm whose messages are cut there
    for res in (r["unrun_child"] for r in four):
        assert res["ok"], res["error"]


def test_a_weight_an_earlier_module_reads_is_mixed_before_it_runs(four):
    # enc reads dec.proj.weight; dec.proj never runs and dec runs after enc
    for res in (r["enc_dec"] for r in four):
        assert res["order"].index("enc") < res["order"].index("dec") and "dec.proj" not in res["order"]
        assert res["ok"], res["error"]


def test_bad_tracking_options_are_refused():
    for algorithm in ("tracking", "tracking_momentum"):
        with pytest.raises(CaramelError, match="head_steps .* algorithm=tracking"):
            GossipOptions(algorithm=algorithm, personalize="head", head_steps=1)
    with pytest.raises(CaramelError, match="algorithm must be one of .*tracking.* got 'trackng'"):
        GossipOptions(algorithm="trackng")
    with pytest.raises(CaramelError, match="algorithm"):
        STRATEGIES.spec("gossip:algorithm=trackng")
    assert STRATEGIES.spec("gossip:algorithm=tracking").options.algorithm == "tracking"


def test_ranks_running_different_modules_keep_the_tracking_invariant(four):
    """A first forward that skips a module on one rank (each rank's own module order), a frozen
    weight, and micro-batches accumulating outside no_sync() that touch different parameters on
    different ranks: the overlapped trackers run, keep sum_i y_i = sum_i g_i and give the
    reference path's parameters bit for bit; the frozen weight stays as it was."""
    for res in (r["divergent"] for r in four):
        for case, *_ in DIVERGENT_CASES:
            r = res[case]
            assert r["errors"] == ["", ""], (case, r["errors"])
            assert len(r["gaps"]) == STEPS and r["scale"] > 0, (case, r)
            assert max(r["gaps"]) <= 1e-12 * r["scale"] and max(r["ref_gaps"]) <= 1e-12 * r["scale"], (case, r)
            assert r["diff"] == 0.0 and r["frozen_kept"], (case, r)


def test_the_parameter_exchange_mixes_the_same_tensors_on_every_rank(four):
    """dpsgd on the complete graph, one rank's first forward skipping a module: after the mix
    every rank holds the same average (each rank's own order would mix a.weight with body.weight)."""
    for res in (r["divergent"] for r in four):
        assert res["dpsgd_spread"] <= 1e-6, res["dpsgd_spread"]


def test_a_clip_that_never_binds_is_refused_at_step_zero_on_every_rank(four):
    """clip_grad_norm_ scales by exactly 1 when it does not bind: still an edit of the gradients
    the trackers left with, refused at the first step on every rank, nothing half-mixed."""
    for res in (r["divergent"] for r in four):
        assert "overlap_trackers=false" in res["late_clip"] and "changed" in res["late_clip"], res["late_clip"]
        assert res["late_clip_untouched"]


def test_ranks_freezing_different_parameters_are_refused(four):
    for res in (r["divergent"] for r in four):
        assert "ranks [1] have other parameters (shapes, requires_grad)" in res["frozen_on_one_rank"], res
