"""Exact parity: Caramel's parameters after 24 steps equal DDP's (and single-process training on
the concatenated global batch, for models without batch statistics), for every planner and
overlap mode, three model families, three optimizers with an LR schedule, 2-4 workers."""
import pytest

from caramel.strategies.planners import planner_names
from caramel.strategies.caramel.trial import trial_baseline
from caramel.testing import run_workers
from tests.distributed.workers import parity_worker

TOL = 1e-5
STEPS = 24  # overlap="auto": 4 profiling steps, a trial pass of 12, a confirmation of 8
# small caps so that models split into several buckets (and the planners have choices)
PLANNER_OPTIONS = {"fifo": {"bucket_cap_mb": 0.02, "first_bucket_mb": 0.005}, "fusion": {"fusion_threshold_mb": 0.02}}


# Every planner at 2 workers; at 3 and 4 one planner each (fusion's merging at an odd world,
# caramel's full plan at 4): the planners' logic does not depend on the world size, and every
# world-size combination cost a third of the suite's time.
PARITY_CASES = [(2, p) for p in planner_names()] + [(3, "fusion"), (4, "caramel")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world, planner", PARITY_CASES)
def test_parity_with_ddp(world, planner):
    results = run_workers(parity_worker, world, args=(planner, STEPS, PLANNER_OPTIONS.get(planner, {})), timeout_s=560)
    for rank, res in enumerate(results):
        for key, value in res.items():
            if key[-1] == "buckets":
                continue
            if key[-1] == "trial":
                # the overlap trial ran inside the 24 steps and every rank made the same choice
                assert value is not None and value["chosen"] in value["step_period_s"], f"rank {rank}: {key}: {value}"
                expected = {f"{planner}/forward", f"{planner}/backward"} | ({"fifo/backward"} if planner != "fifo" else set())
                assert set(value["step_period_s"]) == expected, value
                # an undecided lead keeps the baseline: the plan predicted fastest, else backward
                assert value["baseline"] == trial_baseline(sorted(expected), planner, value["predicted_step_time_s"]), value
                assert (planner == "caramel") == bool(value["predicted_step_time_s"]), value  # only it simulates
                assert value == results[0][key], f"rank {rank} chose differently from rank 0: {value} vs {results[0][key]}"
                continue
            assert value <= TOL, f"rank {rank}: {key} differs by {value:g} (> {TOL})"
    buckets = {k: v for k, v in results[0].items() if k[-1] == "buckets"}
    if planner != "caramel":
        assert max(buckets.values()) > 1, f"the test should exercise several buckets: {buckets}"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", [2, 3])
def test_chunked_plan_in_need_first_order_matches_ddp(world):
    from tests.distributed.workers import chunked_plan_worker
    results = run_workers(chunked_plan_worker, world, args=(STEPS,), timeout_s=380)
    for rank, res in enumerate(results):
        for (family, what), value in res.items():
            if what in ("items", "buckets"):
                assert res[(family, "items")] > res[(family, "buckets")] > 1
                continue
            assert value <= TOL, f"rank {rank}: {family} overlap={what} differs by {value:g}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["cnn_bn", "mlp_unused"])
def test_delegation_to_torch_ddp_is_exact(family):
    from tests.distributed.workers import delegation_worker

    steps = 20
    results = run_workers(delegation_worker, 2, args=(family, steps), timeout_s=200)
    for rank, res in enumerate(results):
        flags = res["delegating"]
        assert not any(flags[s] for s in range(6)) and all(flags[s] for s in range(6, 12)), flags
        assert not any(flags[s] for s in range(12, steps)), "a re-profile takes the gradients back"
        assert res["diff"] <= 2e-5, f"rank {rank} {family}: {res['diff']}"
        # as the trial timed DDP's schedule: on threads at the engine's priority (a group of its own)
        prio = res["comm_priority"]
        engine_threads = 4 if family == "cnn_bn" else 2  # gradients, and the buffer broadcast's group
        assert not res["ddp_on_job_group"], "comm_priority='auto': DDP gets a group of its own on every rank"
        if prio["applied"] == "realtime":
            assert prio["threads"] > engine_threads, prio
        else:
            assert prio["threads"] == 0 and prio["reason"], prio
        assert res["after_shutdown"] and "caramel.shutdown()" in res["after_shutdown"], res["after_shutdown"]


@pytest.mark.timeout(120)
def test_overlap_none_issues_nothing_before_backward_ends(tmp_path):
    from tests.distributed.workers import issue_order_worker

    for overlap, expect_early in (("none", False), ("backward", True)):
        results = run_workers(issue_order_worker, 2, args=(overlap, str(tmp_path)), timeout_s=100)
        for res in results:
            assert res["buckets"] > 2 and len(res["early"]) >= 4, res
            # "none" is the no-overlap reference; "backward" overlaps backward (the same check can fail)
            assert set(res["early"].values()) == {expect_early}, (overlap, res["early"])


@pytest.mark.timeout(200)
def test_hand_over_without_the_unused_parameter_search_when_the_user_vouches():
    from tests.distributed.workers import vouched_delegation_worker

    # every parameter used: torch DDP runs without its search, parameters equal plain DDP's
    for res in run_workers(vouched_delegation_worker, 2, args=("cnn_bn", 12), timeout_s=180):
        assert res["error"] is None and res["search"] is False and res["diff"] <= 1e-5, res
    # a parameter without a gradient after the hand-over: one error that names the option
    for res in run_workers(vouched_delegation_worker, 2, args=("mlp_unused", 12), timeout_s=180):
        assert res["error_step"] > 6 and "find_unused_parameters=False" in res["error"], res
        assert res["error"].startswith("caramel:"), res


@pytest.mark.timeout(120)
def test_a_traced_run_leaves_what_its_plan_was_made_from(tmp_path):
    from caramel.trace.load import load_traces
    from tests.distributed.workers import plan_inputs_worker

    results = run_workers(plan_inputs_worker, 2, args=(str(tmp_path),), timeout_s=100)
    r0, r1 = results
    assert r0["meta"] == {"planned_from_profile": "run.rank0.profile.json", "planned_from_cluster": "run.rank0.cluster.json"}
    assert r1["meta"] == {}  # only the rank that plans
    # the online profile and the measured link make the plan the job ran, offline
    assert r0["replayed"] == r0["ran"] == r1["ran"]
    assert r0["measured_link"] == "profiling steps"
    # the directory still loads as the job's traces, the plan's inputs passed over
    assert load_traces([str(tmp_path)]).world_size == 2


@pytest.mark.timeout(200)
def test_a_reprofile_in_the_middle_of_a_trial_ends_it():
    from tests.distributed.workers import reprofile_mid_trial_worker

    results = run_workers(reprofile_mid_trial_worker, 2, args=(40,), timeout_s=180)
    for rank, res in enumerate(results):
        # profiling took steps 0-3, the trial was running at step 7 and ended with the re-profile;
        # the provisional plan (fifo) stays in force through the profiling steps
        assert res["trial_at_7"] is True and res["trial_after"] is False, res
        assert res["plan_while_profiling"] == res["plan_step_8"] == "fifo", res
        # a new trial ran to its end after the new profile, and training stayed exact
        assert res["final_trial"] is not None and res["settled"], res
        assert res["diff"] <= 2e-5, f"rank {rank}: {res['diff']}"
