"""The gossip exchange sends each direction of a pair on its own process group."""
from __future__ import annotations

import torch

from caramel.strategies.gossip import engine
from caramel.strategies.gossip.engine import Bucket, Exchange
from caramel.strategies.gossip.topology import Neighbours


def test_each_direction_travels_on_its_own_group(monkeypatch):
    batches: list[list[tuple[str, int, str]]] = []

    def p2p_op(op, tensor, peer, group, tag=0):
        return (op.__name__, peer, group)

    def batch(ops):
        assert len({g for _, _, g in ops}) == 1, ops  # torch refuses a batch over several groups
        batches.append(ops)
        return []

    monkeypatch.setattr(engine.dist, "P2POp", p2p_op)
    monkeypatch.setattr(engine.dist, "batch_isend_irecv", batch)
    ex = Exchange(("up", "down"), ranks=[10, 11, 12], rank=1, mix_in_forward=True)
    ex.set_buckets([Bucket([torch.zeros(3)])])
    ex.start(Neighbours(0.4, recv=((0, 0.3), (2, 0.3)), send=(0, 2)))
    ops = sorted(op for b in batches for op in b)
    # index 1 sends down to index 0 and up to index 2; it hears index 0 on up, index 2 on down
    assert ops == sorted([("isend", 10, "down"), ("isend", 12, "up"), ("irecv", 10, "up"), ("irecv", 12, "down")])
