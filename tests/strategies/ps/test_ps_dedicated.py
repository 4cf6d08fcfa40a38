"""Dedicated server processes (`ps:servers=N,dedicated=true`): the last N ranks only serve."""
from __future__ import annotations

import pytest

from caramel.testing import run_workers
from tests.strategies.ps.ps_server_workers import dead_server_worker, suite_worker
from tests.strategies.ps.wire_log import one_at_a_time

TOL = 1e-5
CASES = (("cnn_bn", "sgd_momentum", "ps:servers=2,dedicated=true,clip_grad_norm=0.1"),
         ("gpt_tied", "adam", "ps:servers=2,dedicated=true"),
         ("mlp_unused", "adamw", "ps:servers=2,dedicated=true,consistency=ssp:0,order=tic"))
TAC, RANDOM = (("gpt_tied", "adam", "ps:servers=2,dedicated=true,bucket_cap_mb=0"),  # per tensor: many pulls to order
               ("gpt_tied", "adam", "ps:servers=2,dedicated=true,order=random,bucket_cap_mb=0"))
BAD = (("ps:servers=4,dedicated=true", None, "4 dedicated servers but the job has only 4 ranks"),
       ("ps:dedicated=true", None, "dedicated=true needs servers=N >= 1"),
       ("ps:servers=2", "1", "servers=2 but CARAMEL_PS_SERVERS=1"),
       ("ps", "x", "CARAMEL_PS_SERVERS must be an integer"))


@pytest.fixture(scope="module")
def suite():
    """One job of 2 workers + 2 server processes runs the parity cases, then the checkpoint case."""
    return run_workers(suite_worker, 4, args=(BAD, 20, 2, CASES + (TAC, RANDOM), 3, "ps:servers=2,dedicated=true"),
                       timeout_s=480)  # setup alone took 112 s at load 40-60


def test_bsp_with_dedicated_servers_equals_ddp_over_the_workers(suite):
    """2 workers + 2 server processes, 20 steps, LR scheduler: the workers' parameters are
    within 1e-5 of DDP's over the workers' batches; the servers (ranks 2 and 3) served every
    step of their shards, and the whole server state reaches state_dict(). In the first case the
    servers clip the gradient norm, against DDP + torch.nn.utils.clip_grad_norm_."""
    for rank in (0, 1):
        res = suite[rank]["parity"]
        for case in CASES + (TAC, RANDOM):
            assert res[case] <= TOL, (case, res[case])
            assert res[case + ("moved",)] > 1e-3
            assert res[case + ("state",)] > 0
        assert res[CASES[0] + ("clipped",)] >= 15  # the servers' clipping mattered (DDP clipped most steps)
        assert res[CASES[0] + ("owners",)] == [2, 3]
    for rank in (2, 3):
        for case in CASES + (TAC, RANDOM):
            stats = suite[rank]["parity"][case]
            assert stats["steps"] == 20 and stats["shard"] == rank - 2 and stats["params"], stats
            assert stats["messages"]["gather"] == 1 and stats["messages"]["plan"] == 1, stats


def test_dedicated_servers_send_pulls_one_at_a_time_in_the_planned_order(suite):
    """Each server process hands its shard's pulls to the backend through the ordered sender:
    one at a time (each send complete before the next, on the real gloo groups), in the
    workers' plan order of every update, and every pull it sent went that way. With
    order=random the record follows each update's shuffle, so it differs from TAC's over the
    same buckets; workers send no pulls."""
    records = {}
    for case in CASES + (TAC, RANDOM):
        pulls = suite[0]["parity"][case + ("pulls",)]
        assert pulls == suite[1]["parity"][case + ("pulls",)], case
        assert pulls["issued"] is None and pulls["relayed"] is None, case
        steps = sorted(pulls["at"])
        assert steps == list(range(2, 20)), case  # every update after the online profile's two
        for rank in (2, 3):
            stats, wire = suite[rank]["parity"][case], suite[rank]["parity"][case + ("wire",)]
            planned = [b for u in steps for b in pulls["at"][u] if pulls["owner"][b] == stats["shard"]]
            assert planned, case
            assert [b for u, order in stats["send_log"] if u >= steps[0] for b in order] == planned, case
            assert stats["issued"][-len(planned):] == planned, case
            assert len(stats["issued"]) == sum(len(order) for _, order in stats["send_log"]), case  # none bypassed it
            assert one_at_a_time(wire) and len(wire) == 2 * len(stats["issued"]), case
            records[(case, rank)] = stats["issued"][-len(planned):]
    tac, rnd = suite[0]["parity"][TAC + ("pulls",)], suite[0]["parity"][RANDOM + ("pulls",)]
    assert len({tuple(o) for o in tac["at"].values()}) == 1 and len({tuple(o) for o in rnd["at"].values()}) >= 15
    for rank in (2, 3):
        assert sorted(records[(TAC, rank)]) == sorted(records[(RANDOM, rank)])
        assert records[(TAC, rank)] != records[(RANDOM, rank)]


def test_checkpoint_and_resume_with_dedicated_servers_are_exact(suite):
    """The servers' state goes into the checkpoint (saved from rank 0) and back to the servers
    at load_state_dict: the resumed run equals the uninterrupted one bit for bit."""
    for rank in (0, 1):
        res = suite[rank]["checkpoint"]
        assert res["diff"] == 0.0
        assert res["saved_state_entries"] == res["params"]
    for rank in (2, 3):
        served = suite[rank]["checkpoint"]["served"]
        assert [s["steps"] for s in served] == [6, 3, 3]
        assert [s["messages"]["load"] for s in served] == [0, 0, 1]


def test_ssp_runs_ahead_of_a_slow_worker_with_dedicated_servers(suite):
    """With new hyper-parameters every step (sent to the servers without waiting), rank 0 still
    runs up to 2 updates ahead of a slowed rank 1, never more."""
    assert max(suite[0]["ssp"]["staleness"]) == 2
    assert max(suite[1]["ssp"]["staleness"]) <= 2
    assert suite[2]["ssp"]["steps"] == 10 and suite[3]["ssp"]["steps"] == 10


def test_a_silent_server_is_an_error_within_the_timeout():
    res = run_workers(dead_server_worker, 3, args=(1.0,), timeout_s=60)
    for worker in res[:2]:
        assert worker["error"] is not None
        assert any(w in worker["error"].lower() for w in ("timed out", "timeout", "closed")), worker["error"]
        assert worker["elapsed_s"] < 1.0 + 2.0
    assert res[2]["error"] is not None  # the server, resumed, finds its workers gone


def test_bad_dedicated_server_counts_are_one_clear_error(suite):
    """More servers than ranks (no worker left), none, a count that contradicts the launcher's,
    a launcher count that is no number: each is one error naming it, on every rank."""
    for rank in range(4):
        for (spec, env, expected), err in zip(BAD, suite[rank]["bad"]):
            assert err is not None and expected in err, (spec, env, err)


def test_dedicated_and_hierarchical_is_refused():
    from caramel.errors import CaramelError
    from caramel.strategies.ps.options import PsOptions

    with pytest.raises(CaramelError, match="dedicated=true and hierarchical=true"):
        PsOptions(servers=1, dedicated=True, hierarchical=True)
