"""Which group the engine's collectives run on, decided in one place (`comm_group_for`), and
the backend `init_distributed` picks; no GPU needed: devices and backends are stand-ins."""
import datetime

import pytest
import torch
import torch.distributed as dist

import caramel.distributed as D
from caramel.errors import CaramelError
from caramel.strategies.session import Session


@pytest.fixture
def calls(monkeypatch):
    """Records what comm_group_for builds instead of building it."""
    seen = []
    monkeypatch.setattr(D, "gloo_group", lambda name, parent, threads, timeout_s, priority:
                        seen.append(("gloo", name, parent, threads, timeout_s, priority)) or "gloo-group")
    monkeypatch.setattr(dist, "new_group", lambda ranks, **kw: seen.append(("nccl", ranks, kw)) or "nccl-group")
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: [0, 1, 2] if group == "sub" else [0, 1, 2, 3])
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    return seen


def test_cpu_tensors_get_a_one_thread_gloo_group_with_priority(calls):
    prio = object()
    assert D.comm_group_for(torch.device("cpu"), "parent", "grad-x", priority=prio, timeout_s=7.0) == "gloo-group"
    assert calls == [("gloo", "grad-x", "parent", 1, 7.0, prio)]


def test_cuda_tensors_get_a_private_nccl_group_over_the_parents_ranks(calls, monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert D.comm_group_for("cuda:1", "sub", "grad-x", priority=object(), timeout_s=9.0) == "nccl-group"
    (kind, ranks, kw), = calls
    assert (kind, ranks, kw["backend"], kw["group_desc"]) == ("nccl", [0, 1, 2], "nccl", "grad-x")
    assert kw["timeout"] == datetime.timedelta(seconds=9.0)
    assert kw["use_local_synchronization"] is True  # a subgroup makes it among its own ranks


def test_cuda_tensors_without_nccl_are_a_clear_error(calls, monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(CaramelError, match="no NCCL.*'gloo'"):
        D.comm_group_for("cuda:0", "sub", "grad-x")
    assert calls == []  # nothing built, in particular no gloo group moving CUDA tensors


def test_other_devices_are_refused(calls):
    with pytest.raises(CaramelError, match="meta devices are not supported"):
        D.comm_group_for("meta", "sub", "grad-x")


def test_params_device_refuses_a_model_split_over_devices():
    assert D.params_device([torch.zeros(1), torch.zeros(2)]) == torch.device("cpu")
    with pytest.raises(CaramelError, match="several devices"):
        D.params_device([torch.zeros(1), torch.zeros(1, device="meta")])


def test_control_tensors_follow_the_groups_backend(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert D.collective_device("g") == torch.device("cpu")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert D.collective_device("g") == torch.device("cuda", 3)


@pytest.mark.parametrize("cuda, nccl, expected", [(True, True, "nccl"), (False, True, "gloo"), (True, False, "gloo")])
def test_init_distributed_picks_nccl_only_with_cuda_and_nccl(monkeypatch, cuda, nccl, expected):
    seen = []
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.append(backend))
    monkeypatch.setattr(D, "_info", lambda: None)
    D.init_distributed()
    assert seen == [expected]


def test_session_names_are_the_same_on_every_rank_and_unique_per_model_and_group(monkeypatch):
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: {"a": [0, 1], "b": [2, 3]}[group])
    rank0, rank1 = Session(), Session()  # two processes making the same calls
    names0 = [rank0.group_prefix("a", "f" * 16), rank0.group_prefix("a", "f" * 16), rank0.group_prefix("b", "e" * 16)]
    names1 = [rank1.group_prefix("a", "f" * 16), rank1.group_prefix("a", "f" * 16), rank1.group_prefix("b", "e" * 16)]
    assert names0 == names1
    assert len(set(names0)) == 3
    assert names0[0].endswith("-ffffffffffff-1") and names0[1].endswith("-1") is False


def test_session_shutdown_releases_every_live_engine():
    class FakeEngine:
        released = 0

        def release(self):
            self.released += 1

    session, engines = Session(), [FakeEngine(), FakeEngine()]
    for e in engines:
        session.register(e)
    session.shutdown()
    session.shutdown()  # idempotent for the session; each engine's release is itself idempotent
    assert [e.released for e in engines] == [2, 2]
    assert set(session.live_engines()) == set(engines)
