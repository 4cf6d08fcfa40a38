"""The servers' ordered pull sender and the pull buckets: units, no processes."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies.ps import sender as sender_mod
from caramel.strategies.ps.buckets import make_pull_buckets
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.planner import PsPlan, make_ps_plan
from caramel.sim.synthetic import synthetic_profile


class FakeWork:
    def __init__(self, log: list, k: int, fail: bool):
        self.log, self.k, self.fail = log, k, fail

    def wait(self) -> bool:
        time.sleep(0.01)  # the send on the wire
        self.log.append(("done", self.k))
        if self.fail:
            raise RuntimeError("peer gone")
        return True


def fake_broadcast(log: list, fail_at: int = -1):
    def broadcast(buf, src, group, async_op):
        k = int(buf[0])
        log.append(("issue", k, threading.current_thread().name))
        return FakeWork(log, k, k == fail_at)
    return broadcast


def test_pulls_go_to_the_backend_one_at_a_time_in_order(monkeypatch):
    """Gloo runs two of a group's collectives at once: handed over together, a later pull may
    leave first. The sender hands the next only once the previous has left."""
    log: list = []
    monkeypatch.setattr(sender_mod.dist, "broadcast", fake_broadcast(log))
    s = sender_mod.SerialSender()
    handles = [s.submit(torch.tensor([float(k)]), 0, None, tag=k) for k in range(4)]
    for h in handles:
        assert h.wait()
    s.close()
    assert [x[:2] for x in log] == [(e, k) for k in range(4) for e in ("issue", "done")]
    assert list(s.issued) == [0, 1, 2, 3]
    assert all(x[2] == "caramel-ps-sender" for x in log if x[0] == "issue")


def test_a_failed_pull_fails_every_later_one_and_nothing_hangs(monkeypatch):
    log: list = []
    monkeypatch.setattr(sender_mod.dist, "broadcast", fake_broadcast(log, fail_at=1))
    s = sender_mod.SerialSender()
    handles = [s.submit(torch.tensor([float(k)]), 0, None, tag=k, what=f"pull of bucket {k} (shard 0)") for k in range(3)]
    assert handles[0].wait()
    with pytest.raises(CaramelError, match=r"ps: pull of bucket 1 \(shard 0\) failed: peer gone") as failed:
        handles[1].wait()
    assert isinstance(failed.value.__cause__, RuntimeError)
    with pytest.raises(CaramelError, match=r"pull of bucket 2 .* not sent: the earlier pull of bucket 1"):
        handles[2].wait()
    s.close()
    assert ("issue", 2) not in [x[:2] for x in log]  # nothing more goes to a failed peer


def test_the_sender_thread_is_for_gloo_only(monkeypatch):
    backends = {"a": "gloo", "b": "nccl"}
    monkeypatch.setattr(sender_mod.dist, "get_backend", lambda g: backends[g])
    assert sender_mod.uses_sender(["a", "a"]) and not sender_mod.uses_sender(["a", "b"])
    assert not sender_mod.uses_sender([])


def test_send_pull_goes_through_the_sender_where_there_is_one(monkeypatch):
    """Colocated, dedicated and hierarchical servers all send a pull with `send_pull`: through
    the ordered sender on gloo, straight to the backend without one (NCCL)."""
    log: list = []
    monkeypatch.setattr(sender_mod.dist, "broadcast", fake_broadcast(log))
    s = sender_mod.SerialSender()
    sent = sender_mod.send_pull(s, torch.tensor([3.0]), 0, None, 3, "pull of bucket 3 (shard 0)")
    assert isinstance(sent, sender_mod.SentPull) and sent.wait()
    s.close()
    assert list(s.issued) == [3] and log[0][2] == "caramel-ps-sender"
    direct = sender_mod.send_pull(None, torch.tensor([4.0]), 0, None, 4, "pull of bucket 4 (shard 0)")
    assert isinstance(direct, FakeWork) and log[-1][:2] == ("issue", 4)
    assert log[-1][2] == threading.current_thread().name


def test_the_issued_log_is_bounded(monkeypatch):
    monkeypatch.setattr(sender_mod.dist, "broadcast", lambda buf, src, group, async_op: FakeWork([], 0, False))
    monkeypatch.setattr(sender_mod, "ISSUED_KEPT", 4)
    monkeypatch.setattr(FakeWork, "wait", lambda self: True)
    s = sender_mod.SerialSender()
    for h in [s.submit(torch.zeros(1), 0, None, tag=k) for k in range(10)]:
        h.wait()
    s.close()
    assert list(s.issued) == [6, 7, 8, 9]


def test_pull_buckets_follow_the_need_order_per_shard():
    # need order 0..5; shards alternate; 100 bytes each, cap 250: two per bucket
    owner = {i: i % 2 for i in range(6)}
    sizes = {i: 100 for i in range(6)}
    kinds = {i: "f32" for i in range(6)}
    assert make_pull_buckets(list(range(6)), owner, sizes, kinds, 250) == [[0, 2], [1, 3], [4], [5]]


def test_the_first_needed_pull_bucket_holds_only_the_first_layers():
    """Push buckets follow the ready order (last layer first), so the last push bucket of a
    shard holds its first layers and whatever else fits; pull buckets start at the first
    layer. Every order moves the same pull buckets."""
    prof = synthetic_profile(sizes_bytes=[300_000] * 8, forward_time_s=0.02, backward_time_s=0.04,
                             optimizer_time_s=0.002)
    plans = {o: make_ps_plan(prof, PsOptions(order=o, placement="roundrobin", bucket_cap_mb=1.0,
                                             pull_bucket_cap_mb=0.5), shards=1, bandwidth_Bps=1e8)
             for o in ("tac", "tic", "fifo", "random")}
    tac = plans["tac"]
    assert tac.pull_buckets[tac.bucket_pull[0]] == [0]  # alone: two would pass 0.5 MB
    assert all(p.pull_buckets == tac.pull_buckets for p in plans.values())
    assert tac.buckets != tac.pull_buckets
    assert tac.predicted["pull_buckets"] == len(tac.pull_buckets) == 8


def test_the_first_needed_pull_bucket_holds_the_first_layers_several_to_a_bucket():
    """100 KB tensors, pull cap 0.25 MB: two to a pull bucket, in need order, while the one push
    bucket (ready order) holds all eight; TAC's first pull is the first two layers."""
    prof = synthetic_profile(sizes_bytes=[100_000] * 8, forward_time_s=0.02, backward_time_s=0.04,
                             optimizer_time_s=0.002)
    plans = {o: make_ps_plan(prof, PsOptions(order=o, placement="roundrobin", bucket_cap_mb=1.0,
                                             pull_bucket_cap_mb=0.25), shards=1, bandwidth_Bps=1e8)
             for o in ("tac", "fifo")}
    tac = plans["tac"]
    assert sorted(map(sorted, tac.pull_buckets)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tac.pull_buckets[tac.bucket_pull[0]] == [0, 1]
    assert len(tac.buckets) == 1 and sorted(tac.buckets[0]) == list(range(8))
    assert plans["fifo"].pull_buckets == tac.pull_buckets


def test_a_plan_from_before_pull_buckets_pulls_its_push_buckets():
    d = make_ps_plan(synthetic_profile(sizes_bytes=[1000] * 4, forward_time_s=0.01, backward_time_s=0.02,
                                       optimizer_time_s=0.001), PsOptions(), shards=2).to_dict()
    d.pop("pull_buckets")
    d["bucket_pull"] = list(range(len(d["buckets"])))
    old = PsPlan.from_dict(d)
    assert old.pull_buckets == old.buckets


@pytest.mark.parametrize("value", ["-1", "nan", "x"])
def test_a_bad_pull_cap_is_one_error_naming_it(value):
    from caramel.errors import CaramelError
    from caramel.strategies import STRATEGIES
    with pytest.raises(CaramelError, match="pull_bucket_cap_mb"):
        STRATEGIES.spec(f"ps:pull_bucket_cap_mb={value}").options


@pytest.mark.parametrize("spec", ["ps:pull_bucket_cap_mb=4", "ps:bucket_cap_mb=0,pull_bucket_cap_mb=0.5"])
def test_a_pull_cap_above_the_push_cap_is_one_error_naming_both(spec):
    from caramel.errors import CaramelError
    from caramel.strategies import STRATEGIES
    with pytest.raises(CaramelError, match=r"pull_bucket_cap_mb \(.*\) must be at most bucket_cap_mb"):
        STRATEGIES.spec(spec).options


def test_the_pull_cap_defaults_to_the_push_cap():
    from caramel.strategies.ps.options import PsOptions
    assert PsOptions(bucket_cap_mb=0).pull_cap_mb() == 0 and PsOptions(bucket_cap_mb=4).pull_cap_mb() == 4
    assert PsOptions(bucket_cap_mb=4, pull_bucket_cap_mb=0.5).pull_cap_mb() == 0.5
