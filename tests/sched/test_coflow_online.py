"""The online check of the coflow policy: a restricted state holds its jobs alone, neither the
decisions nor the policy's inputs before a job arrives change when it and every later job are
removed from the trace (the trace-wide feature scale of greedy decoding would), the check never
serves worse than the policy's proposal on the arrived set, and with every job arrived at once
it is the offline rollout's guarantee against the base heuristic."""
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from caramel.errors import CaramelError  # noqa: E402
from caramel.sched.coflow import HEURISTICS, Coflow, Flow, Job, TraceOptions, Workload, simulate  # noqa: E402
from caramel.sched.coflow import synthetic_trace  # noqa: E402
from caramel.sched.coflow.decode import Decoding, decode, policy_logits  # noqa: E402
from caramel.sched.coflow.env import CoflowEnv, EnvOptions  # noqa: E402
from caramel.sched.coflow.fabric import FabricSim, Result  # noqa: E402
from caramel.sched.coflow.online import decode_arrived  # noqa: E402
from caramel.sched.coflow.rollout import MARGIN, finish, objective_total, rollout_values  # noqa: E402
from caramel.sched.rl import PpoOptions, make_ppo  # noqa: E402

TRACE = TraceOptions(num_jobs=6, max_steps=2, max_layers=5)
BASE = HEURISTICS["weighted_srjf"]


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    env = CoflowEnv(TRACE, [0], EnvOptions(objective="weighted_jct", base="weighted_srjf"))
    # an untrained network whose prior does not dominate, so its picks spread over the rows
    model = make_ppo(env, PpoOptions(width=8, prior=0.0, seed=3))
    return env, policy_logits(model)


def test_a_restricted_state_holds_its_jobs_alone_and_runs_as_they_would():
    w = synthetic_trace(TraceOptions(num_jobs=5, max_steps=2, max_layers=5, mean_interarrival_s=0.0), 1)
    sim = FabricSim(w)
    for _ in range(6):
        sim.advance(BASE(sim))
    keep = [1, 3]
    view, ids = sim.restricted(keep)
    assert [j.arrival_s for j in view.workload.jobs] == [w.jobs[j].arrival_s for j in keep]
    assert ids == sorted(c for j in keep for c in w.jobs[j].coflows)
    assert [ids[c] for c in view.active] == [c for c in sim.active if w.coflows[c].job in keep]
    np.testing.assert_array_equal(view.finished_s, sim.finished_s[ids])
    # everything arrived: the view of all jobs runs on exactly as the state itself
    whole, _ = sim.restricted(sim.arrived_jobs())
    assert len(whole.workload.jobs) == 5
    np.testing.assert_array_equal(finish(whole, BASE).jct_s, finish(sim.clone(), BASE).jct_s)
    crossed = Workload(2, 1.0, (Job(0, 1.0, 0.0, (0, 1), (0,)), Job(1, 1.0, 0.0, (0, 1), (1,))),
                       (Coflow(0, 0, 0, 0, (Flow(0, 1, 1.0),), (), 0.0),
                        Coflow(1, 1, 0, 0, (Flow(1, 0, 1.0),), (0,), 0.0)))
    with pytest.raises(CaramelError, match="depends on \\(0,\\), outside jobs \\[1\\]"):
        FabricSim(crossed).restricted([1])


def _first_jobs(w: Workload, k: int) -> Workload:
    """`w` cut to its jobs 0..k-1: the later jobs removed (their count and arrival times too)."""
    coflows = w.coflows[:w.jobs[k].coflows[0]]
    assert all(c.job < k for c in coflows)  # the trace numbers its coflows job by job
    return Workload(w.num_ports, w.port_bandwidth_Bps, w.jobs[:k], coflows)


def _decode_recording(env, w: Workload, logits, decoding: Decoding):
    """The decisions (`arrived:*`; None for the others) and every observation passed to the
    policy, in order."""
    seen = []
    decoded = decode(env, w, lambda obs: (seen.append(obs.copy()), logits(obs))[1], decoding)
    return decoded.decisions, seen


def test_decisions_and_the_policys_inputs_before_a_job_arrives_do_not_see_it(setup):
    env, logits = setup
    w = synthetic_trace(TRACE, 0)
    whole, whole_seen = _decode_recording(env, w, logits, Decoding(arrived="check"))
    assert len(whole_seen) == len(whole)  # one policy call per decision
    compared = near_cut = after_arrival = overruled = 0
    for k in range(1, len(w.jobs)):
        cut_s = w.jobs[k].arrival_s
        cut, cut_seen = _decode_recording(env, _first_jobs(w, k), logits, Decoding(arrived="check"))
        n = sum(d.time_s < cut_s for d in whole)
        assert [d for d in cut if d.time_s < cut_s] == whole[:n], k  # the decisions, values included
        for a, b in zip(whole_seen[:n], cut_seen[:n]):
            np.testing.assert_array_equal(a, b, err_msg=f"the policy's input before job {k} arrives")
        compared += n
        near_cut += any(cut_s - 0.005 < d.time_s for d in whole[:n])  # a look-ahead of 5 ms would show
        after_arrival += any(d.arrived_jobs == k for d in whole[:n])  # job k-1 is in, job k not yet
        overruled += sum(d.served != d.proposed for d in whole[:n])
    # the cuts are not vacuous: decisions fall just before arrivals and after the last one, rollouts act
    assert compared > len(whole) and near_cut >= 2 and after_arrival >= 3 and overruled >= 1
    # and the comparison can fail: greedy decoding scales the features over the whole trace
    k = next(k for k, j in enumerate(w.jobs) if j.arrival_s > whole[0].time_s)
    greedy_seen = [_decode_recording(env, x, logits, Decoding())[1][0] for x in (w, _first_jobs(w, k))]
    assert not np.array_equal(*greedy_seen)  # the same first decision, before job k arrives


def test_the_check_serves_no_worse_than_the_proposal_on_the_arrived_jobs(setup, monkeypatch):
    env, logits = setup
    from caramel.sched.coflow import online
    rolled = []  # candidates rolled out per call
    monkeypatch.setattr(online, "rollout_values", lambda view, base, cands, objective: (
        rolled.append(len(cands)), rollout_values(view, base, cands, objective))[1])
    overruled = saved = 0
    for seed in range(3):
        rolled.clear()
        decisions = decode(env, synthetic_trace(TRACE, seed), logits, Decoding(arrived="check")).decisions
        for d in decisions:
            assert d.arrived_jobs == sum(j.arrival_s <= d.time_s for j in synthetic_trace(TRACE, seed).jobs)
            if d.values:
                assert d.proposed in d.values and d.values[d.served] <= d.values[d.proposed]
                if d.served != d.proposed:
                    assert d.values[d.served] < d.values[d.proposed] * (1 - MARGIN)
                    overruled += 1
            else:
                assert d.served == d.proposed
        with_reuse = sum(rolled)
        again = decode_arrived(env, synthetic_trace(TRACE, seed), logits, "check", reuse=False)[1]
        assert again == decisions  # the base's value carried from the last rollout is the one recomputed
        saved += sum(rolled) - 2 * with_reuse
        served_base = decode(env, synthetic_trace(TRACE, seed), logits, Decoding(arrived="base")).decisions
        assert all(len(d.values) in (0, 2) for d in served_base)  # the proposal and the base's pick, if they differ
    assert overruled > 0  # the check does overrule the untrained policy
    assert saved > 0  # and the carried value did spare rollouts


def test_with_every_job_arrived_it_is_the_offline_rollout(setup):
    env, logits = setup
    trace = dataclasses.replace(TRACE, mean_interarrival_s=0.0)
    gained = False
    for seed in (0, 6):  # 6: the check beats the base by 2.2%
        w = synthetic_trace(trace, seed)
        greedy = decode(env, w, logits)
        online = decode(env, w, logits, Decoding(arrived="greedy"))
        np.testing.assert_array_equal(online.result.jct_s, greedy.result.jct_s)  # the same features, the same picks
        checked = decode(env, w, logits, Decoding(arrived="check"))
        base = objective_total(simulate(w, BASE), "weighted_jct")
        # Bertsekas: each decision's served value is at most the base's pick's, which is the last one's
        # served value, up to the MARGIN the proposal is kept by
        assert checked.totals[0] <= base / (1 - MARGIN) ** len(checked.decisions)
        assert checked.totals[0] == pytest.approx(checked.decisions[-1].values.get(
            checked.decisions[-1].served, checked.totals[0]), rel=1e-12)
        assert isinstance(checked.result, Result)
        gained |= checked.totals[0] < base * (1 - 1e-9)
    assert gained
