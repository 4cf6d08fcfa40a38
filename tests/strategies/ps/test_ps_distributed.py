"""The ps strategy on 2 gloo workers: DDP parity, wire order, consistency, checkpoints."""
from __future__ import annotations

import numpy as np
import pytest

from caramel.testing import run_workers
from caramel.strategies.ps.options import ASP_BOUND_STEPS
from tests.distributed.workers import buffer_change_worker
from tests.strategies.ps.ps_workers import (HIER_RUNS, behaviour_worker, checkpoint_worker, clip_worker, dead_peer_worker,
                                            hierarchical_worker, no_sync_bn_worker, ssp_buffers_worker, parity_worker,
                                            push_traffic_worker)
from tests.strategies.ps.wire_log import one_at_a_time

TOL = 1e-5


def test_bsp_equals_ddp_on_the_parity_models():
    """20 steps, every family (BatchNorm, tied transformer, unused parameters) x SGD momentum /
    Adam / AdamW with an LR scheduler: within 1e-5 of DDP, and the model did train."""
    results = run_workers(parity_worker, 2, args=(20, ("ps",)), timeout_s=240)
    for res in results:
        diffs = {k: v for k, v in res.items() if len(k) == 3}
        assert len(diffs) == 9
        assert max(diffs.values()) <= TOL, diffs
        assert min(v for k, v in res.items() if k[-1] == "moved") > 1e-3
        assert all(v > 0 for k, v in res.items() if k[-1] == "state")  # the whole server state after synchronize
        assert len([k for k in res if k[-1] == "buffers"]) == 3
        assert max(v for k, v in res.items() if k[-1] == "buffers") <= TOL
        # with BatchNorm, every training forward after the profiling steps took rank 0's buffers sent at step()
        assert min(v for k, v in res.items() if k[0] == "cnn_bn" and k[-1] == "early") >= 20 - 3


RANDOM = "ps:order=random,bucket_cap_mb=0"  # per tensor: enough transfers for many distinct orders
SPECS = ("ps", "ps:consistency=ssp_0", RANDOM, "ps:consistency=ssp_2+slow", "ps+slow",
         "ps:consistency=asp", "ps:servers=1,placement=roundrobin")


@pytest.fixture(scope="module")
def behaviour():
    return run_workers(behaviour_worker, 2, args=(10, SPECS, 0.03), timeout_s=240)


def test_the_wire_order_is_the_planned_order(behaviour):
    """Every update's broadcasts were handed to the backend in the plan's order, the same on
    both ranks; order=random gives a fresh order per update."""
    for spec in SPECS:
        r0, r1 = behaviour[0][spec], behaviour[1][spec]
        assert len(r0["sent"]) >= 8
        assert [o for _, o in r0["sent"]] == r0["expected"], spec
        assert r0["sent"] == r1["sent"], spec
        for r in (r0, r1):  # a colocated server hands its own pulls to the backend one by one, in that order
            assert r["issued"] == r["mine_expected"], spec
        assert r0["issued"] and r0["wire"], spec
        for r in (r0, r1):  # on the real gloo groups: each broadcast leaves before the next is handed over
            wire = r["wire"]
            assert len(wire) >= 2 * len(r["issued"]), spec  # this engine's sends (and the profiling engine's)
            assert one_at_a_time(wire), spec
    random_orders = {tuple(o) for _, o in behaviour[0][RANDOM]["sent"]}
    assert len(random_orders) >= 5
    assert behaviour[0]["ps"]["stats"]["order"] == "tac"


def test_ssp0_is_bsp_bit_for_bit_and_every_rank_ends_equal(behaviour):
    for spec in SPECS:
        a, b = behaviour[0][spec]["params"], behaviour[1][spec]["params"]
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), spec
    bsp = behaviour[0]["ps"]["params"]
    for spec in ("ps:consistency=ssp_0", "ps+slow", RANDOM):
        assert all(np.array_equal(x, y) for x, y in zip(bsp, behaviour[0][spec]["params"])), spec
    one_server = behaviour[0]["ps:servers=1,placement=roundrobin"]
    assert set(one_server["owner"].values()) == {0}
    assert max(float(np.abs(x - y).max()) for x, y in zip(bsp, one_server["params"])) <= TOL


def test_staleness_is_bounded_and_used(behaviour):
    """With rank 1 slowed, ssp:2 lets rank 0 run two updates ahead (never more); bsp never does."""
    for rank in (0, 1):
        assert set(behaviour[rank]["ps+slow"]["stats"]["staleness"]) == {0}
        assert max(behaviour[rank]["ps:consistency=ssp_2+slow"]["stats"]["staleness"]) <= 2
        assert max(behaviour[rank]["ps:consistency=asp"]["stats"]["staleness"]) <= ASP_BOUND_STEPS
    assert max(behaviour[0]["ps:consistency=ssp_2+slow"]["stats"]["staleness"]) == 2
    stale = behaviour[0]["ps:consistency=ssp_2+slow"]["params"]
    assert max(float(np.abs(x - y).max()) for x, y in zip(behaviour[0]["ps"]["params"], stale)) > 1e-5


def test_stats_and_server_state(behaviour):
    for spec in SPECS:
        res = behaviour[0][spec]
        assert "synchronize" in res["early_state_error"]
        assert res["state_entries"] == len(res["params"])  # every server's state, on every rank
        stats = res["stats"]
        assert stats["E_median"] is not None and stats["S"] is not None
        # E of every order, from the online profile; which order wins on it depends on the
        # timings measured (TAC >= FIFO on fixed profiles: test_options_placement, test_simulate)
        for order in ("tac", "tic", "fifo", "random"):
            assert stats["predicted"][order]["E"] <= 1.0 + 1e-9 and stats["predicted"][order]["makespan_s"] > 0
        assert sum(x["bytes"] for x in stats["shard_loads"]) > 0


def test_checkpoint_and_resume_are_exact():
    """Saved on rank 0 only after synchronize (server state included), loaded into a fresh
    model and optimizer on every rank: the resumed run equals the uninterrupted one. (First,
    ranks asking for different options get one clear error each.)"""
    for res in run_workers(checkpoint_worker, 2, args=(5, "ps"), timeout_s=180):
        assert "ranks [1] have other options than rank 0 (ps:order=tic vs ps)" in res["mismatch"]
        assert res["diff"] == 0.0
        assert res["moved"] > 1e-3
        assert res["saved_state_entries"] == res["params"]


def test_a_silent_peer_is_an_error_within_the_timeout():
    res = run_workers(dead_peer_worker, 2, args=(1.0,), timeout_s=60)
    assert res[0]["error"] is not None
    assert "timed out" in res[0]["error"].lower() or "closed" in res[0]["error"].lower(), res[0]["error"]
    assert res[0]["elapsed_s"] < 1.0 + 2.0


@pytest.fixture(scope="module")
def push_traffic() -> list[dict]:
    """`push_traffic_worker`: 3 gloo ranks, 4 steps, run once for the tests that read it."""
    return run_workers(push_traffic_worker, 3, args=(4,), timeout_s=120)


@pytest.fixture(scope="module")
def hierarchical():
    return run_workers(hierarchical_worker, 4, args=(6, 2), timeout_s=200)


def test_hierarchical_aggregation_equals_ddp(hierarchical):
    """Two nodes of two ranks: gradients summed within the node, then across nodes at the
    servers (the nodes' first ranks); pulls relayed by each node's leader in the plan's order.
    Fused and per tensor, TAC and random order, and with the path taken off gloo (NCCL's: the
    node sums reduced among the leaders at the hooks and `step()`, no thread, no receives
    posted): DDP's parameters."""
    for res in hierarchical:
        for family, spec in HIER_RUNS:
            assert res[(family, spec, "diff")] <= TOL, (family, spec)
            assert res[(family, spec, "servers")] == [0, 2]
            assert res[(family, spec, "sent")] == res[(family, spec, "expected")]
        assert max(res["ssp_staleness"]) <= 2
        assert res["threadless_sender"] is None and res["threadless_diff"] <= TOL  # NCCL's path, run on gloo
        assert all(np.array_equal(a, b) for a, b in zip(hierarchical[0]["ssp_params"], res["ssp_params"]))


def test_a_leader_sends_its_node_sums_before_step_is_called(hierarchical):
    """Each leader sends every node sum for another server as soon as its node's reduce has
    landed, from backward's hooks and a thread, without waiting for `step()`: after backward,
    with `step()` not yet called, every such send completes (a server that posted its
    receives only at `step()` fails this: no send completed). Each goes on the leader's own
    pull group, so its pulls to that server queue behind it on the link."""
    for rank, res in enumerate(hierarchical):
        for step in res["forwarded"]:
            if rank % 2:
                assert step["expected"] == [] and step["handed"] == [], (rank, step)
                continue
            assert step["expected"], (rank, step)
            assert step["handed"] == step["expected"] and step["sent"] == step["expected"], (rank, step)
            assert all(step["on_own_pull_group"]), (rank, step)


def test_a_server_leader_posts_its_receives_before_its_own_gradients_are_ready(hierarchical):
    """Hierarchical on gloo, a server leader posts its receive of every other leader's node sum
    of each bucket it serves at the step's first gradient, before any of its own gradients is
    ready (as a colocated server: gloo moves a message only once both ends have posted it);
    posted at its first push instead, each receive sees a gradient ready and fails this. The
    other ranks post none. The per-tensor run of `test_a_leader_sends_its_node_sums_...`."""
    for rank, res in enumerate(hierarchical):
        for step in res["forwarded"]:
            if rank % 2:
                assert step["posted_at_ready"] == [], (rank, step)
                continue
            # two nodes: one receive, from the other leader, per bucket this leader serves
            assert len(step["posted_at_ready"]) == step["served"] > 0, (rank, step)
            assert set(step["posted_at_ready"]) == {0}, (rank, step["posted_at_ready"])


def test_hierarchical_leaders_send_pulls_one_at_a_time_in_the_planned_order(hierarchical):
    """A server leader's pulls to the other leaders and every leader's relays to its node go
    through the ordered senders: handed to the backend one at a time (each send complete
    before the next, on the real gloo groups), in the plan's order of every update. The
    other ranks send no pulls. With order=random the record follows each update's shuffle,
    so it differs from TAC's over the same buckets."""
    for rank, res in enumerate(hierarchical):
        for family, spec in HIER_RUNS:
            pulls, wire = res[(family, spec, "pulls")], res[(family, spec, "wire")]
            steps = sorted(pulls["at"])
            assert len(steps) == 4, (rank, spec)
            if rank % 2:
                assert pulls["issued"] is None and pulls["relayed"] is None and wire == [], (rank, spec)
                continue
            planned = [b for u in steps for b in pulls["at"][u]]
            assert pulls["relayed"] == planned, (rank, spec)
            assert pulls["issued"] == [b for b in planned if pulls["owner"][b] == rank // 2], (rank, spec)
            assert pulls["issued"] and one_at_a_time(wire), (rank, spec)
            assert len(wire) >= 2 * (len(pulls["issued"]) + len(pulls["relayed"])), (rank, spec)
        tac = res[("gpt_tied", "ps:hierarchical=true,bucket_cap_mb=0", "pulls")]
        rnd = res[("gpt_tied", "ps:hierarchical=true,order=random,bucket_cap_mb=0", "pulls")]
        assert len({tuple(o) for o in tac["at"].values()}) == 1
        assert len({tuple(o) for o in rnd["at"].values()}) == 4
        if rank % 2 == 0:
            assert sorted(tac["relayed"]) == sorted(rnd["relayed"]) and tac["relayed"] != rnd["relayed"]
            assert tac["issued"] != rnd["issued"]


CLIP_CASES = (("cnn_bn", "adam", "ps:servers=1,consistency=ssp:0,clip_grad_norm=0.1", 0.1),)  # rank 1 serves nothing: adds 0


def test_servers_clip_like_ddp_with_clip_grad_norm():
    """The servers clip the averaged gradient's global norm (their shards' squared norms summed
    in one all-reduce): 20 steps equal DDP + torch.nn.utils.clip_grad_norm_ within 1e-5, on a
    run where the norm was over the limit at most steps. (Two servers clipping: the dedicated
    servers' suite.)"""
    for res in run_workers(clip_worker, 2, args=(20, CLIP_CASES), timeout_s=180):
        for _, _, spec, _ in CLIP_CASES:
            assert res[(spec, "clipped")] >= 15, res
            assert res[spec] <= TOL, (spec, res[spec])


def test_a_push_is_a_send_to_the_server(push_traffic):
    """3 ranks: each push is what the model (and a parameter server) has it be, the other
    workers sending their bucket to the shard's server, and no collective in which the server
    sends too (gloo's reduce sends half of every bucket back out of the server); still DDP's
    parameters. Each push goes on the pusher's own pull group (every rank serves here), the
    group its pulls leave on, so on each link its pulls queue behind its pushes (one gloo
    group is one connection per pair); on the server's push group, as before, the pulls
    shared the link with pushes still on the wire."""
    results = push_traffic
    sent, received = [], []
    for rank, res in enumerate(results):
        assert res["diff"] <= TOL
        assert res["seen"], "no push went through the push or pull groups"
        for op, kind, shard, peer, nbytes in res["seen"]:
            assert op in ("isend", "irecv"), op
            assert kind == "pull", f"a push on the {kind} group of shard {shard}, not the pusher's pull group"
            if op == "isend":  # shard s is served by rank s (colocated); the pusher's own group
                assert rank != peer and shard == rank
                sent.append((rank, peer, nbytes))
            else:  # the server receives each worker's push on that worker's group
                assert rank != peer and shard == peer
                received.append((peer, rank, nbytes))
    assert sent and sorted(sent) == sorted(received)


def test_a_server_posts_its_receives_before_its_own_gradients_are_ready(push_traffic):
    """Colocated on gloo, a server posts its receive of every other worker's push of each
    bucket it serves at the step's first gradient, before any of its own gradients is ready:
    gloo moves a point-to-point message only once both ends have posted it, so a receive
    posted at the server's own push of the bucket (as off gloo) held a faster worker's push
    until the server's backward got there. The late path, run on gloo in the same job, posts
    each receive with gradients ready (so it fails this) and equals DDP too. The 3-rank run of
    `test_a_push_is_a_send_to_the_server`."""
    for rank, res in enumerate(push_traffic):
        for path in (res, res["late"]):
            assert path["diff"] <= TOL
            assert len(path["posted_at_ready"]) == len([s for s in path["seen"] if s[0] == "irecv"]) > 0, rank
        assert set(res["posted_at_ready"]) == {0}, (rank, res["posted_at_ready"])
        assert min(res["late"]["posted_at_ready"]) > 0, (rank, res["late"]["posted_at_ready"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("change", ["reset", "load", "forwards"])
def test_bsp_buffers_changed_after_step_on_every_rank_match_ddp(change):
    """Statistics changed on every rank between step() and the next forward (reset, a model-only
    load_state_dict, precise-BN forwards) two steps before the end: the early broadcast sent at
    step() is stale, so every rank takes DDP's broadcast at the forward; buffers equal DDP's."""
    for rank, res in enumerate(run_workers(buffer_change_worker, 2, args=(True, "all", 8, "ps", change, 6),
                                           timeout_s=100)):
        assert res["error"] is None, f"rank {rank}: {res['error']}"
        assert res["diff"] <= TOL and res["eval_diff"] <= TOL, f"rank {rank}: {res}"
        assert res["buffers_equal"], f"rank {rank}: buffers (num_batches_tracked included) differ from DDP's: {res}"


@pytest.mark.timeout(120)
def test_bsp_forward_mode_takes_rank_zero_only_changes_as_ddp():
    """broadcast_buffers="forward": no early send, rank 0's buffers at each synced forward, as DDP."""
    for rank, res in enumerate(run_workers(buffer_change_worker, 2, args=("forward", "rank0", 8, "ps", "reset", 6),
                                           timeout_s=100)):
        assert res["error"] is None, f"rank {rank}: {res['error']}"
        assert res["diff"] <= TOL and res["eval_diff"] <= TOL and res["buffers_equal"], f"rank {rank}: {res}"


@pytest.mark.timeout(120)
def test_bsp_no_sync_with_batchnorm_matches_ddp():
    for rank, res in enumerate(run_workers(no_sync_bn_worker, 2, args=(9, "ps"), timeout_s=100)):
        assert res["diff"] <= TOL and res["buffers"] <= TOL, f"rank {rank}: {res}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_ssp_synchronize_shares_buffers_only_when_asked(broadcast_buffers):
    """ssp sends rank 0's buffers at synchronize(); with broadcast_buffers=False each rank keeps its own, as DDP."""
    ranks = run_workers(ssp_buffers_worker, 2, args=(3, broadcast_buffers), timeout_s=100)
    assert (ranks[0] == ranks[1]) == broadcast_buffers
