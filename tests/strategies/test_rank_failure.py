"""A rank's local failure at a collective decision is raised on every rank, never a hang."""
from __future__ import annotations

import pickle

import pytest

from caramel.strategies.rank_failure import Failed, RankFailedError, raise_failed, run_local
from caramel.testing import run_workers
from tests.strategies.rank_failure_workers import balance_failure_worker


def _boom():
    raise KeyError("k")


def test_a_failure_is_carried_as_text_and_raised_naming_the_rank():
    mine = run_local(_boom, "could not plan")
    assert isinstance(mine, Failed) and mine.cause == "KeyError: 'k'"
    copy = pickle.loads(pickle.dumps(mine))  # what a peer receives: no exception object
    assert copy.error is None and copy.cause == mine.cause
    with pytest.raises(RankFailedError, match=r"^plan: rank 2 could not plan: KeyError: 'k'$") as info:
        raise_failed("plan", [1, None, copy], rank=2, mine=mine)
    assert isinstance(info.value.__cause__, KeyError)  # the failing rank keeps its traceback
    with pytest.raises(RankFailedError) as info:
        raise_failed("plan", {0: copy}, rank=1)  # a peer: the cause as text only
    assert info.value.__cause__ is None


def test_a_group_rank_is_named_with_its_global_rank():
    with pytest.raises(RankFailedError, match=r"^plan: group rank 1 \(global rank 5\) could not plan: KeyError"):
        raise_failed("plan", [None, run_local(_boom, "could not plan")], rank=0, ranks=[4, 5])
    with pytest.raises(RankFailedError, match=r"^plan: rank 1 could not plan"):  # the same numbers: once
        raise_failed("plan", [None, run_local(_boom, "could not plan")], rank=0, ranks=[0, 1])


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


def test_the_cause_is_text_even_when_the_exception_cannot_print_or_is_huge():
    """Building the marker must not raise on the failing rank (it would leave, its peers wait)."""
    def unprintable():
        raise _Unprintable()

    def huge():
        raise ValueError("x" * 100_000)

    assert run_local(unprintable, "could not plan").cause == "_Unprintable: <message could not be shown>"
    cause = run_local(huge, "could not plan").cause
    assert cause.startswith("ValueError: xxx") and len(cause) < 4100 and cause.endswith("(96000 more characters)")


def test_nothing_is_raised_when_no_rank_failed():
    assert run_local(lambda: 3, "x") == 3
    raise_failed("plan", [1, (None, 2)], rank=0)
    raise_failed("plan", {0: None}, rank=0)


@pytest.mark.timeout(60)
def test_a_balancer_whose_fit_raises_on_one_rank_fails_every_rank_at_once():
    """Before the fix rank 1 left with its ValueError and rank 0 waited in the all-gather until
    the group's timeout (10 s here) while rank 1's process lived, else got gloo's "connection
    closed" without the cause (seen here): both must raise the clear error within seconds."""
    results = run_workers(balance_failure_worker, 2, timeout_s=40, collective_timeout_s=10)
    for r in results:
        assert r["type"] == "RankFailedError", r
        assert r["message"] == "balance: rank 1 could not fit its step cost: ValueError: the fit blew up"
        assert r["after_s"] < 5.0, r


def _planning_rank(monkeypatch, rank: int, world: int, box: list, planner_options: dict | None = None,
                   engine=None):
    """A controller's plan_from_profile on `rank` with rank 0's planner raising a CaramelError;
    the broadcast is `box` (rank 0 pickles its data in, the others read it out)."""
    from types import SimpleNamespace

    import caramel.strategies.caramel.controller as controller
    from caramel.errors import CaramelError

    def broadcast(data, src, group):
        if rank == 0:
            box[:] = [pickle.dumps(data[0])]
        else:
            data[0] = pickle.loads(box[0])

    def bad_plan(*args, **kwargs):
        raise CaramelError("planner 'x' takes no option 'y'")

    monkeypatch.setattr(controller.dist, "broadcast_object_list", broadcast)
    monkeypatch.setattr(controller, "make_plan", bad_plan)
    monkeypatch.setattr(controller, "module_uses", lambda profile: {})
    c = SimpleNamespace(fingerprint="f", rank=rank, world=world, group=controller.dist.group.WORLD, cluster=None,
                        planner="p", planner_options=planner_options or {}, engine=engine,
                        _compressed=lambda name, plan, *rest: plan, trial_specs=lambda: [("p/forward", "p", "forward")])
    profile = SimpleNamespace(fingerprint=lambda: "f", meta={})
    return lambda: controller.Controller.plan_from_profile(c, profile)


def test_rank_0s_failed_branch_description_is_raised_on_every_rank(monkeypatch):
    """branch_order="auto": rank 0 describes the model's branches before planning; that raising
    on rank 0 alone left the others in the broadcast too."""
    from types import SimpleNamespace

    def describe():
        raise TypeError("branch 'b' has no inputs")

    box: list = []
    for rank in (0, 1):
        engine = SimpleNamespace(branch_forward=SimpleNamespace(describe=describe))
        with pytest.raises(RankFailedError, match=r"^plan: rank 0 could not describe its branches: "
                                                  r"TypeError: branch 'b' has no inputs$"):
            _planning_rank(monkeypatch, rank, 2, box, {"branch_order": "auto"}, engine)()


def test_rank_0s_failed_plan_is_raised_on_every_rank_and_stays_a_caramel_error(monkeypatch):
    """Rank 0 plans and broadcasts: a planner raising on rank 0 alone left the other ranks in the
    broadcast until the group's timeout. Now the failure is what rank 0 broadcasts."""
    from caramel.errors import CaramelError
    from caramel.strategies.rank_failure import RankInputError

    box: list = []
    for rank in (0, 1):
        with pytest.raises(RankInputError, match=r"^plan: rank 0 could not plan the candidates: "
                                                 r"CaramelError: planner 'x' takes no option 'y'$") as info:
            _planning_rank(monkeypatch, rank, 2, box)()
        assert isinstance(info.value, CaramelError)  # bad input stays one to those who catch it
        assert isinstance(info.value.__cause__, CaramelError) == (rank == 0)
    with pytest.raises(CaramelError, match=r"^planner 'x' takes no option 'y'$"):  # one process: as it was
        _planning_rank(monkeypatch, 0, 1, box)()


def test_ps_rank_0s_failed_profile_or_plan_is_raised_on_workers_and_servers(monkeypatch):
    """ps: rank 0 builds the profile and plans, then broadcasts the plan to the workers and the
    dedicated servers; a failure on rank 0 is what it broadcasts, raised everywhere."""
    from types import SimpleNamespace

    import caramel.strategies.ps.run as run
    import caramel.strategies.ps.server as server
    from caramel.strategies.ps.engine import CMD_PLAN

    box, now, told, drained = [], [0], [], []  # the broadcast's data; the rank running now; servers told, by rank;
    # the ranks that drained the last step's pulls (a dedicated server waits in its sends until the workers have)

    def broadcast(data, src, group):
        if now[0] == 0:
            box[:] = [pickle.dumps(data[0])]
        else:
            data[0] = pickle.loads(box[0])

    def bad_profile(*args):
        raise RuntimeError("no timings")

    def bad_plan(profile):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(run.dist, "broadcast_object_list", broadcast)
    monkeypatch.setattr(server.dist, "broadcast_object_list", broadcast)
    monkeypatch.setattr(run, "build_profile", bad_profile)

    def worker(rank: int):
        now[0] = rank
        w = SimpleNamespace(rank=rank, ranks=[0, 1, 2], groups=SimpleNamespace(dedicated=[2], control=None),
                            module=object(), tracker=None, timer=SimpleNamespace(samples=[], remove=lambda: None),
                            engine=SimpleNamespace(synchronize=lambda: drained.append(rank)), _plan=bad_plan,
                            _tell_servers=lambda code: told.append((rank, code)))
        w._adopt_plan = lambda profile: run.PsRun._adopt_plan(w, profile)
        return w

    for rank in (0, 1):
        with pytest.raises(RankFailedError, match=r"^ps plan: rank 0 could not build the model profile: "
                                                  r"RuntimeError: no timings$"):
            run.PsRun._plan_online(worker(rank))
    now[0] = 2
    s = SimpleNamespace(rank=2, ranks=[0, 1, 2], groups=SimpleNamespace(control=None),
                        _wait_sends=lambda: drained.append(2))
    with pytest.raises(RankFailedError, match=r"^ps plan: rank 0 could not build the model profile"):
        server.PsServer._plan(s)
    assert drained == [0, 1, 2]  # every rank drained before raising, as on success: none waits for a pull
    for rank in (0, 1):  # a profile, then the planner raising
        with pytest.raises(RankFailedError, match=r"^ps plan: rank 0 could not plan: ZeroDivisionError: "):
            worker(rank)._adopt_plan(object())
    assert told == [(0, CMD_PLAN), (1, CMD_PLAN)] * 2  # the servers take part in every broadcast
    assert drained == [0, 1, 2, 0, 1]


def test_a_profile_that_one_rank_cannot_build_is_raised_on_every_rank(monkeypatch):
    """Every rank builds its profile at the last profiling step, then measures the cluster with
    collectives: a rank whose build raised left the others there. Now the ranks gather the
    failures first (at that one step: `ends_this_step`, alike on every rank)."""
    from types import SimpleNamespace

    import caramel.strategies.caramel.controller as controller
    import caramel.strategies.rank_failure as rank_failure

    sent: dict[int, bytes] = {}

    def gather(out, mine, group):
        sent[now[0]] = pickle.dumps(mine)
        out[:] = [pickle.loads(sent.get(r, pickle.dumps(None))) for r in range(len(out))]

    def build(rank: int):
        if rank == 1:
            raise KeyError("module 'fc' has no timings")
        return None  # not reached: the ranks raise before using a profile

    monkeypatch.setattr(rank_failure.dist, "all_gather_object", gather)
    now, stopped = [1], []
    for rank in (1, 0):  # rank 1 gathers first here, so rank 0 sees its failure
        now[0] = rank
        profiler = SimpleNamespace(ends_this_step=lambda: True, step_end=lambda rank=rank: build(rank),
                                   stop=lambda rank=rank: stopped.append(rank))
        c = SimpleNamespace(world=2, rank=rank, group=None, profiler=profiler)
        with pytest.raises(RankFailedError, match=r"^profiling: rank 1 could not build its profile: "
                                                  r"KeyError: \"module 'fc' has no timings\"$") as info:
            controller.Controller._profiling_step_end(c)
        assert isinstance(info.value.__cause__, KeyError) == (rank == 1)
        assert c.profiler is None  # a caller that caught the error and steps on does not gather again
    assert stopped == [1, 0]  # the collectives are no longer timed


def test_a_profile_built_where_ends_this_step_said_no_is_an_error():
    """The failures are gathered only where `ends_this_step()`: a profile built at another step
    would skip that gather, and one rank's failed build would hang the others again."""
    from types import SimpleNamespace

    from caramel.strategies.caramel.profiling import profiling_step_end

    early = SimpleNamespace(ends_this_step=lambda: False, step_end=lambda: "profile")
    with pytest.raises(AssertionError, match="ends_this_step"):
        profiling_step_end(early, None, 2, 0)
    assert profiling_step_end(early, None, 1, 0) == "profile"  # one process: no gather to miss


@pytest.mark.parametrize("profile_steps", [1, 2, 3])
def test_ends_this_step_is_true_exactly_at_the_step_that_builds_the_profile(monkeypatch, profile_steps):
    """A real `OnlineProfiler` stepped through a tiny model's profiling steps (an engine stand-in;
    the build itself stubbed): `ends_this_step()` before each `step_end()` agrees with whether
    that step returned the profile."""
    from types import SimpleNamespace

    import torch
    import torch.nn as nn

    import caramel.strategies.caramel.profiling as profiling

    monkeypatch.setattr(profiling, "build_profile", lambda *args, **kwargs: "profile")
    monkeypatch.setattr(profiling, "add_split_backward", lambda *args: None)
    engine = SimpleNamespace(start_measuring=lambda: None, add_listeners=lambda **kw: None,
                             remove_listeners=lambda **kw: None, wait_this_step_s=0.0,
                             stats=SimpleNamespace(last_wait_s=0.0))
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    params = list(model.parameters())
    p = profiling.OnlineProfiler(engine, model, params, 0, profile_steps, measure_split=False)
    seen = []
    for _ in range(profile_steps + 4):
        p.forward_pre()
        loss = model(torch.ones(3, 2)).sum()
        p.forward_post()
        loss.backward()
        p._bwd_end()
        ends = p.ends_this_step()
        seen.append((ends, p.step_end() is not None))
        if seen[-1][1]:
            break
    assert seen[-1] == (True, True) and all(e == built for e, built in seen), seen
    assert len(seen) == 2 + profile_steps
