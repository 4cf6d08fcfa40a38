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
