"""A bench block carries a steady block's work for every consistency (`caramel.bench.blocks`).

A fake runner on a fake clock: each step computes for `compute_s`, then hands its update to a
FIFO link that carries one update per `comm_s`, then (ssp:S) waits for update t - S; `finish()`
waits for every update. Comm-bound (comm_s = 2 compute_s), so a steady step is `comm_s`.
"""
from types import SimpleNamespace

import pytest

from caramel.bench import blocks
from caramel.bench.baselines import Runner
from caramel.bench.strategies import steady_entry
from caramel.strategies.ps.options import PsOptions

COMPUTE_S, COMM_S, STEPS = 1.0, 2.0, 8


class _LinkRunner(Runner):
    def __init__(self, clock: list[float], bound: int | None, calls: list[str], comm_s: float = COMM_S):
        self.clock, self.bound, self.calls, self.comm_s = clock, bound, calls, comm_s
        self.done_at: list[float] = []  # per update since the last drain: when its transfer ends
        self.link_free = 0.0

    def step(self) -> None:
        self.calls.append("step")
        self.clock[0] += COMPUTE_S
        self.link_free = max(self.link_free, self.clock[0]) + self.comm_s
        self.done_at.append(self.link_free)
        t = len(self.done_at) - 1
        if self.bound is not None and t - self.bound >= 0:
            self.clock[0] = max(self.clock[0], self.done_at[t - self.bound])

    def finish(self) -> None:
        self.calls.append("finish")
        self.clock[0] = max([self.clock[0], *self.done_at])
        self.done_at = []


@pytest.fixture
def fake_clock(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(blocks, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=lambda: clock[0]))
    return clock


def _runner(clock, consistency: str, calls=None, comm_s: float = COMM_S) -> _LinkRunner:
    options = PsOptions(consistency=consistency)
    runner = _LinkRunner(clock, options.staleness_bound(), calls if calls is not None else [], comm_s)
    runner.entry_steps, runner.drain_timed = steady_entry(SimpleNamespace(options=options))
    return runner


def test_the_entry_follows_the_bound_on_outstanding_updates():
    assert steady_entry(None) == (1, False)  # ddp, caramel, gossip, ...: no ps run
    assert steady_entry(SimpleNamespace(options=PsOptions())) == (1, False)  # bsp
    assert steady_entry(SimpleNamespace(options=PsOptions(consistency="ssp:0"))) == (1, False)
    assert steady_entry(SimpleNamespace(options=PsOptions(consistency="ssp:2"))) == (3, False)
    assert steady_entry(SimpleNamespace(options=PsOptions(consistency="asp"))) == (0, True)
    assert (Runner.entry_steps, Runner.drain_timed) == (1, False)


@pytest.mark.parametrize("consistency,comm_s", [("ssp:1", 1.5), ("ssp:2", 2.0), ("ssp:3", 3.0)])
def test_an_ssp_block_times_steady_steps_from_its_first(fake_clock, consistency, comm_s):
    """From an empty link the bound binds by the first timed step where comm/compute > (S + 1) / 2
    (the limit docs/benchmarks.md states); the drain is then the backlog the entry steps owed in."""
    runner = _runner(fake_clock, consistency, comm_s=comm_s)
    for _ in range(2):  # a second block starts from the drained, empty link as well
        assert blocks.measure_block(runner, STEPS) == [comm_s] * STEPS


def test_one_entry_step_under_ssp_times_a_transient_on_an_empty_link(fake_clock):
    """What the bench timed before: the first S - 1 steps ride the empty link (mean 1.75 s, not 2)."""
    runner = _runner(fake_clock, "ssp:2")
    runner.entry_steps = 1
    times = blocks.measure_block(runner, STEPS)
    assert times[:2] == [COMPUTE_S, COMPUTE_S] and sum(times) / STEPS < COMM_S


def test_an_asp_block_holds_its_updates_drain(fake_clock):
    """asp never waits: the steps run at compute pace and the drain, on the last step, carries the
    rest; the window holds the block's 8 updates and one step's fill, against 8 computes untimed."""
    calls: list[str] = []
    runner = _runner(fake_clock, "asp", calls)
    stamps: list[list[float]] = []
    times = blocks.measure_block(runner, STEPS, stamps)
    assert calls == ["step"] * STEPS + ["finish"]
    assert times[:-1] == [COMPUTE_S] * (STEPS - 1)
    assert sum(times) == pytest.approx(STEPS * COMM_S + COMPUTE_S)
    assert stamps[-1][1] == fake_clock[0] and len(stamps) == STEPS


def test_a_bsp_block_is_the_old_block_call_for_call(fake_clock):
    """bsp, DDP, caramel: one untimed entry step, the timed steps, an untimed drain, as always."""
    calls: list[str] = []
    runner = _runner(fake_clock, "bsp", calls)
    stamps: list[list[float]] = []
    times = blocks.measure_block(runner, STEPS, stamps)
    assert calls == ["step"] * (STEPS + 1) + ["finish"]
    assert times == [COMM_S + COMPUTE_S] * STEPS  # bsp waits for its own update: nothing overlaps here
    assert stamps[-1][1] == 3.0 * (STEPS + 1)  # the last step's end, not the drain's


@pytest.mark.parametrize("spec,entry", [("ps:consistency=ssp:2", (3, False)), ("ps:consistency=asp", (0, True)),
                                        ("ps", (1, False)), ("ddp", (1, False))])
def test_the_bench_runner_takes_its_entry_from_the_ps_run(monkeypatch, spec, entry):
    """build_strategy reads the bound off the optimizer's ps run (`opt.ps`), which parallelize
    gives the ps strategy (the real call runs in the bench's spawned jobs)."""
    import caramel
    import torch

    from caramel.bench.matrix import parse_strategy
    from caramel.bench.strategies import StrategyContext, build_strategy

    def parallelize(model, optimizer, name, options=None, **_):
        opt = SimpleNamespace(synchronize=lambda: None)  # what the bench calls of a wrapped optimizer
        if name == "ps":
            opt.ps = SimpleNamespace(options=options)
        return model, opt

    monkeypatch.setattr(caramel, "parallelize", parallelize)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = StrategyContext(device=torch.device("cpu"), rank=0, world_size=1)
    runner = build_strategy(parse_strategy(spec), model, opt, None, None, None, ctx)
    assert (runner.entry_steps, runner.drain_timed) == entry


@pytest.mark.parametrize("consistency,steps,entry", [
    ("ssp:6", 8, (7, False)),  # the last bound a block of 8 can reach in time
    ("ssp:7", 8, (0, True)), ("ssp:200", 8, (0, True)),  # 8 entry steps or more would carry the block
    ("ssp:31", 64, (32, False)), ("ssp:32", 64, (0, True)),  # asp's own bound (ASP_BOUND_STEPS)
    ("ssp:2", None, (3, False)), ("ssp:40", None, (0, True)),
    ("bsp", 1, (1, False)), ("ssp:0", 1, (1, False))])  # no stale updates: one entry step, whatever the block
def test_an_ssp_bound_a_block_cannot_reach_is_timed_as_asp(consistency, steps, entry):
    assert steady_entry(SimpleNamespace(options=PsOptions(consistency=consistency)), steps) == entry


def test_a_wide_ssp_bound_runs_no_untimed_steps_in_a_block(fake_clock):
    """ssp:200 in blocks of 8: no 201 untimed entry steps, and the drain is in the window as asp's."""
    calls: list[str] = []
    options = PsOptions(consistency="ssp:200")
    runner = _LinkRunner(fake_clock, options.staleness_bound(), calls)
    runner.entry_steps, runner.drain_timed = steady_entry(SimpleNamespace(options=options), STEPS)
    times = blocks.measure_block(runner, STEPS)
    assert calls == ["step"] * STEPS + ["finish"]
    assert sum(times) == pytest.approx(STEPS * COMM_S + COMPUTE_S)
