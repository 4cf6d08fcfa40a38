"""`caramel train`'s checkpoint of the Caramel engine's per-rank state: rank 0 writes it, so
`Parallel.optimizer_state` gathers each rank's error feedback, balancer window and overlap
trial periods, and
`load_optimizer_state` hands each rank its own (one process: the collectives are stubbed)."""
import torch
import torch.distributed as dist

from caramel.runtime.optimizer import ADAPTIVE_STATE_KEY, COMPRESSION_STATE_KEY
from caramel.train.strategy import RANK_COMPRESSION_KEY, Parallel


class _Optimizer:
    def __init__(self, state):
        self.state, self.loaded = state, None

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.loaded = state


def _rank_state(rank: int) -> dict:
    window = {"version": 1, "kind": "batch", "world": 2, "shared": {"steps": 4}, "ranks": {rank: {"times": [[8, [0.1 * (rank + 1)]]]}}}
    trial = {"version": 1, "block": 1, "ranks": {rank: {"blocks_s": [[[0.01 * (rank + 1)]], []]}}}
    return {"state": {}, "param_groups": [], COMPRESSION_STATE_KEY: {"residual": {"w": torch.full((2,), float(rank))}, "q": {}},
            ADAPTIVE_STATE_KEY: {"balance": window, "trial": trial}}


def _parallel(state) -> Parallel:
    p = Parallel.__new__(Parallel)  # the wrapper alone: no model is parallelized here
    p.kind, p.optimizer = "caramel", _Optimizer(state)
    return p


def test_every_rank_keeps_its_own_error_feedback_and_window(monkeypatch):
    ranks = [_rank_state(0), _rank_state(1)]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)

    def gather(out, mine):  # every rank's (error feedback, balance entry, trial periods), as rank 0 receives them
        for r, s in enumerate(ranks):
            out[r] = (s[COMPRESSION_STATE_KEY], s[ADAPTIVE_STATE_KEY]["balance"], {"trial": s[ADAPTIVE_STATE_KEY]["trial"]["ranks"]})
    monkeypatch.setattr(dist, "all_gather_object", gather)
    saved = _parallel(ranks[0]).optimizer_state()
    assert [float(c["residual"]["w"][0]) for c in saved[RANK_COMPRESSION_KEY]] == [0.0, 1.0]
    assert saved[ADAPTIVE_STATE_KEY]["balance"]["ranks"] == {0: {"times": [[8, [0.1]]]}, 1: {"times": [[8, [0.2]]]}}
    trial = saved[ADAPTIVE_STATE_KEY]["trial"]
    assert trial["block"] == 1 and trial["ranks"] == {0: {"blocks_s": [[[0.01]], []]}, 1: {"blocks_s": [[[0.02]], []]}}

    monkeypatch.setattr(dist, "get_rank", lambda *a: 1)
    p = _parallel({})
    p.load_optimizer_state(saved)
    assert RANK_COMPRESSION_KEY not in p.optimizer.loaded
    assert torch.equal(p.optimizer.loaded[COMPRESSION_STATE_KEY]["residual"]["w"], torch.ones(2))  # rank 1's, not rank 0's
