"""The placement environment in rounds (gymnasium; needs the `rl` extra): what the round
decoder (`rounds.decode_rounds`) does, one decision per step, so the policy trains on it.

Round r asks, for every task with a layer r, in greedy_regret's order at the round's start,
which node that layer goes to; every observation is `PlacementEnv`'s, of the state at the
round's start (the round's earlier choices are not seen, as the decoder, which decides them all
in one forward pass, cannot see them). After the round's last choice `rounds.commit` settles
the memory and the layers are placed; that step's reward is minus what the round added (over
the instance's scale), the others' 0, so the return is still minus the placement's cost.
Teachers (`rollout.ilp_teacher`, `rollout.rollout_teacher`) see `state` at the round's start,
the current `task` and its node `order`, as in `PlacementEnv`.

`groups=G` (as `RoundBatch`'s): the round's queue is split into G groups (sizes as
`np.array_split`); each group's observations are of the state at the group's start (after the
earlier groups were settled and placed), and each group is settled on its own, its reward at its
end. G=1 (the default) is the round above.
"""
from __future__ import annotations

import numpy as np

from caramel.errors import CaramelError
from caramel.sched.placement.env import PlacementEnv
from caramel.sched.placement.heuristics import MEMORY_SLACK_MB
from caramel.sched.placement.rounds import commit


class RoundPlacementEnv(PlacementEnv):
    """`PlacementEnv` whose layers are chosen a round at a time (see the module)."""

    def __init__(self, options, seeds: list[int], groups: int = 1):
        if not (isinstance(groups, (int, np.integer)) and groups >= 1):
            raise CaramelError(f"RoundPlacementEnv needs groups >= 1 (an integer), got {groups!r}")
        self.groups = int(groups)
        super().__init__(options, seeds)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._queue: list[int] = []
        self._pos = 0
        return super().reset(seed=seed, options=options)

    def _start_round(self) -> None:
        s = self.state
        open_ = s.open_tasks()
        self._round_scores = {t: s.scores(t) for t in open_}
        regret = {}
        for t in open_:
            ordered = np.sort(self._round_scores[t])
            regret[t] = float(ordered[1] - ordered[0]) if np.isfinite(ordered[1]) else float("inf")
        self._queue = sorted(open_, key=lambda t: (-regret[t], t))  # as RoundBatch.priority
        sizes = [len(g) for g in np.array_split(np.arange(len(open_)), min(self.groups, len(open_)))]
        self._ends = [int(e) for e in np.cumsum(sizes)]  # where each group of the queue ends
        self._start = 0  # where the current group starts
        self._pos = 0
        self._chosen: dict[int, int] = {}

    def _next(self) -> None:
        if self._pos >= len(self._queue):
            self._start_round()
        self.task = self._queue[self._pos]
        self._scores = self._round_scores[self.task]
        self._order = np.argsort(self._scores, kind="stable")
        self.order = [int(k) for k in self._order]

    def step(self, action: int):
        nodes = self.order
        a = int(action)
        if a >= len(nodes) or not np.isfinite(self._scores[nodes[a]]):
            a = 0  # a masked row: the best node instead, as PlacementEnv
        self._chosen[self.task] = nodes[a]
        self._pos += 1
        reward = 0.0
        if self._pos in self._ends:
            reward = -self._commit(self._queue[self._start:self._pos]) / self.scale_s
            self._start = self._pos
            if self._pos < len(self._queue):  # the next group sees the memory this one took
                s = self.state
                nxt = self._queue[self._pos:self._ends[self._ends.index(self._pos) + 1]]
                self._round_scores.update({t: s.scores(t) for t in nxt})
        done = self.state.done
        if not done:
            self._next()
        obs = np.zeros(self.observation_space.shape, np.float32) if done else self._observe()
        return obs, reward, done, False, {}

    def _commit(self, group: list[int]) -> float:
        """Settle a group of the round, in queue order (`rounds.commit`, as the decoder does),
        and place its layers; the cost they add."""
        s = self.state
        active = sorted(group)
        pos = {t: i for i, t in enumerate(active)}
        chosen = np.array([[self._chosen[t] for t in active]])
        priority = np.array([[pos[t] for t in group]])
        order = np.array([[np.argsort(self._round_scores[t], kind="stable") for t in active]])
        need = np.array([s.tables.weights_mb[t, s.next_layer[t]] for t in active])
        free_ext = np.append(s.free_mb, np.inf)[None, :]
        nodes = commit(chosen, priority, order, need, free_ext)[0]
        # commit's own promise, checked here because place() below cannot: no node holds more
        # than its room (plus the slack per layer placed there)
        on_node = np.bincount(nodes, weights=need, minlength=free_ext.shape[1])[:-1]
        count = np.bincount(nodes, minlength=free_ext.shape[1])[:-1]
        assert (on_node <= s.free_mb + MEMORY_SLACK_MB * count).all(), "commit overfilled a node"
        added = 0.0
        # commit checked the room; the memory left is its own (its per-node sums), so that it
        # equals the decoder's to the last bit
        s.free_mb[:] = np.inf
        for t in group:
            self._left_mb[t, s.next_layer[t]] = 0.0
            added += s.place(t, int(nodes[pos[t]]))
        s.free_mb[:] = free_ext[0, :-1]
        return added
