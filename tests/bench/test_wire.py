"""Bytes on the wire per sample: the interface counters, their sum over ranks, the report's arithmetic."""
from __future__ import annotations

from caramel.bench import wire
from caramel.bench.report import _wire_per_sample

PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  999999      10    0    0    0     0          0         0   888888      10    0    0    0     0       0          0
  eth0:    5000      20    0    0    0     0          0         0     {tx}      30    0    0    0     0       0          0
"""


def test_transmit_counter_leaves_loopback_out(tmp_path, monkeypatch):
    dev = tmp_path / "dev"
    dev.write_text(PROC_NET_DEV.format(tx=7000))
    assert wire.namespace_tx_bytes(str(dev)) == 7000
    assert wire.namespace_tx_bytes(str(tmp_path / "missing")) is None

    readings = iter([1000, 4000, 4000, 4500])
    monkeypatch.setattr(wire, "namespace_tx_bytes", lambda: next(readings))
    meter = wire.WireMeter()
    for _ in range(2):
        with meter.count("pipeline", 11):
            pass
    assert meter.totals() == {"pipeline": {"bytes": 3500, "steps": 22}}
    job = wire.merge_ranks([meter.totals(), {"pipeline": {"bytes": 500, "steps": 22}}])
    assert job == {"pipeline": {"bytes": 4000, "steps": 22}}
    # 4000 bytes over 22 steps of 2 workers x 5 samples
    assert _wire_per_sample(job["pipeline"], 5, 2) == 4000 / (22 * 10)
    assert _wire_per_sample(None, 5, 2) is None and _wire_per_sample(job["pipeline"], None, 2) is None


def test_the_rounds_count_each_blocks_entry_steps_on_the_wire(monkeypatch):
    """measure_rounds charges a block's bytes to its timed steps plus its runner's entry steps
    (3 under ssp:2, 0 under asp): every step sends 100 bytes, so the meter reads 100 a step."""
    from types import SimpleNamespace

    from caramel.bench import harness
    from caramel.bench.baselines import Runner
    from caramel.bench.matrix import BenchSettings

    sent = [0]

    class Sending(Runner):
        def __init__(self, entry_steps: int, drain_timed: bool):
            self.entry_steps, self.drain_timed = entry_steps, drain_timed

        def step(self) -> None:
            sent[0] += 100

    monkeypatch.setattr(wire, "namespace_tx_bytes", lambda: sent[0])
    monkeypatch.setattr(harness, "dist", SimpleNamespace(barrier=lambda: None))  # one process: nothing to line up
    monkeypatch.setattr(harness, "settle", lambda runner, name: 0)
    runners = {"ssp": Sending(3, False), "asp": Sending(0, True), "bsp": Sending(1, False)}
    meter = wire.WireMeter()
    harness.measure_rounds(runners, BenchSettings(rounds=2, steps_per_round=4, warmup_steps=1), "test", 1, wire=meter)
    assert meter.totals() == {"ssp": {"bytes": 1400, "steps": 14}, "asp": {"bytes": 800, "steps": 8},
                              "bsp": {"bytes": 1000, "steps": 10}}
