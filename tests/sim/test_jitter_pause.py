"""The bench's jitter in the all-reduce simulator: a pause after each forward (`caramel.sim.jitter`)."""
import dataclasses
import statistics

import pytest

from caramel.bench.hetero import JitterSchedule
from caramel.sim import simulate
from caramel.sim.jitter import JITTER_STEPS, forward_pauses_s
from tests.sim.helpers import slow_link_cluster, two_bucket_plan, two_layer_profile

UNIT_S, FRACTION, SEED = 0.5, 0.5, 7


def _jittered(cluster, **extra):
    jitter = {"rank": 1, "fraction": FRACTION, "seed": SEED, "pause_after_forward": True, "pause_unit_s": UNIT_S}
    return dataclasses.replace(cluster, meta={**cluster.meta, "compute_jitter": {**jitter, **extra}})


@pytest.mark.parametrize("overlap", ["backward", "forward", "none"])
def test_each_step_waits_for_the_later_workers_pause(overlap):
    """Two workers of equal speed: rank 0 sleeps (nominal - 1) x unit = 0.5 s after every
    forward, rank 1 (nominal x draw - 1) x unit, nominal 2. Every collective starts once both
    issued it, so each step is the step without jitter plus the longer of the two pauses."""
    profile, cluster = two_layer_profile(), slow_link_cluster()
    plan = two_bucket_plan(profile)
    steady = simulate(profile, cluster, plan, overlap=overlap, trace=False).step_time_s
    result = simulate(profile, _jittered(cluster), plan, overlap=overlap, trace=False)
    schedule = JitterSchedule(FRACTION, SEED)  # the draws the bench's jittered worker sleeps by
    draws = [schedule.next() for _ in range(JITTER_STEPS + 1)]
    # the job's steps 1..K (step 0 has no update to wait for): rank 1's pause against rank 0's 0.5 s
    steps = [steady + max(0.5, max(2 * d - 1, 0.0) * UNIT_S) for d in draws[1:]]
    assert result.step_time_s == pytest.approx(statistics.fmean(steps), rel=1e-9)
    assert result.meta["job_step_median_s"] == pytest.approx(statistics.median(steps), rel=1e-9)
    assert result.meta["jitter_steps"] == JITTER_STEPS
    # E[max]: the mean lies above the per-step median, which sits near the padding alone
    assert result.step_time_s > result.meta["job_step_median_s"] >= steady + 0.5 - 1e-12


def test_the_pauses_are_the_bench_sleeps():
    """Per rank and step: max(nominal x draw - 1, 0) x the unit, the draws the gossip model reads."""
    profile, cluster = two_layer_profile(), slow_link_cluster()
    pauses = forward_pauses_s(profile, _jittered(cluster), 5)
    schedule = JitterSchedule(FRACTION, SEED)
    assert pauses[0] == [0.5] * 5
    assert pauses[1] == pytest.approx([schedule.sleep_factor() * UNIT_S for _ in range(5)])


def test_without_the_pause_jitter_the_prediction_is_unchanged():
    """No `compute_jitter`, or one that scales compute (not the bench's pause): the engine runs
    as before, to the bit."""
    profile, cluster = two_layer_profile(), slow_link_cluster()
    plan = two_bucket_plan(profile)
    base = simulate(profile, cluster, plan, overlap="backward", trace=False)
    assert forward_pauses_s(profile, cluster, 4) is None
    scaled = dataclasses.replace(cluster, meta={"compute_jitter": {"rank": 1, "fraction": 0.5, "seed": 0}})
    assert forward_pauses_s(profile, scaled, 4) is None
    again = simulate(profile, scaled, plan, overlap="backward", trace=False)
    assert again.step_time_s == base.step_time_s and again.iteration_times_s == base.iteration_times_s
    assert "job_step_mean_s" not in again.meta and base.meta["iterations"] == 4
