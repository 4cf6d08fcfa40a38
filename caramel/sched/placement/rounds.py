"""Placing a layer of every task at once: the policy decoded in rounds, one forward pass per
round instead of one per layer.

The sequential decoder (`batch.BatchPlacement`) places one layer per step and, before each
forward pass, redoes greedy_regret's work of that step (every open task's scores, their
regrets, the next task): its time is greedy_regret's plus the network's, per layer. Here round r
places layer r of every task that has one. At the round's start, for all S samples and all A
tasks at once (one set of array operations over an (S, A, K) block): each task's lookahead
scores and node order, the (S, A, K, F) observation (`PlacementEnv`'s features, each task seen
as if it were the one to place), one forward pass over the S*A rows, each row's node drawn or
taken greedily. `commit` then settles the round's memory in greedy_regret's order (the task
that loses most by missing its best node first, computed once per round): a task keeps its node
while the node's room lasts, the others move to their best node that still has room (the cloud
always has). A large instance of 30 tasks of 8 layers takes 8 forward passes instead of 240.
The policy is trained on the same rounds (`round_env.RoundPlacementEnv`, whose observations and
placements these equal, tested), so it learns to choose without seeing its round-mates' choices.

`groups=G` splits each round into G groups (sizes as `np.array_split`) in that settling order,
computed once at the round's start: a forward pass per group, each group observing (and
settling into) the memory its earlier groups took, so the most contested choices are seen by
the later ones; G=1 (the default) is the round in one pass, as above.
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.sched.placement.batch import scale_and_mean_mb, static_features, wish_table
from caramel.sched.placement.decode import Decoded, Decoding, step_probabilities
from caramel.sched.placement.heuristics import MEMORY_SLACK_MB
from caramel.sched.placement.local_search import SearchOptions, local_search
from caramel.sched.placement.problem import Instance
from caramel.sched.placement.tables import StepTables


def commit(chosen: np.ndarray, priority: np.ndarray, order: np.ndarray, need_mb: np.ndarray,
           free_ext_mb: np.ndarray) -> np.ndarray:
    """One round's nodes, memory settled. `chosen` (S, A): each task's node; `priority` (S, A):
    the tasks' positions in settling order; `order` (S, A, K): each task's nodes by score;
    `need_mb` (A,) or (S, A): each task's layer weight; `free_ext_mb` (S, K): room per node, the cloud
    inf (updated in place). In passes: of the tasks still unsettled, those that claim a node
    keep it while the claims so far, in settling order, fit its room; the rest claim their
    first node in score order with room left, and so on (the first claimant of a node always
    fits, so every pass settles some). Returns the nodes (S, A)."""
    s_count, a_count = chosen.shape
    k = free_ext_mb.shape[1]
    rows = np.arange(s_count)[:, None]
    cand = np.take_along_axis(chosen, priority, axis=1)
    need = np.take_along_axis(np.broadcast_to(need_mb, chosen.shape), priority, axis=1)
    ordp = np.take_along_axis(order, priority[..., None], axis=1)
    final = np.full((s_count, a_count), -1)
    pending = np.ones((s_count, a_count), dtype=bool)
    nodes = np.arange(k)
    while True:
        claim = (cand[..., None] == nodes) & pending[..., None]
        weights = np.where(claim, need[..., None], 0.0)
        mine = np.take_along_axis(np.cumsum(weights, axis=1), cand[..., None], axis=2)[..., 0]
        ok = pending & (mine <= free_ext_mb[rows, cand] + MEMORY_SLACK_MB)
        final[ok] = cand[ok]
        free_ext_mb -= np.where(ok[..., None], weights, 0.0).sum(axis=1)  # the cloud stays inf
        pending &= ~ok
        if not pending.any():
            break
        fits = need[..., None] <= free_ext_mb[rows[..., None], ordp] + MEMORY_SLACK_MB
        first = np.take_along_axis(ordp, np.argmax(fits, axis=2)[..., None], axis=2)[..., 0]
        cand = np.where(pending, first, cand)
    out = np.empty_like(final)
    np.put_along_axis(out, priority, final, axis=1)
    return out


class RoundBatch:
    """`samples` placements of `inst`, built a round (a layer of every task) at a time, in
    `groups` forward passes per round."""

    def __init__(self, inst: Instance, samples: int, tables: StepTables | None = None, groups: int = 1):
        if samples < 1:
            raise CaramelError(f"RoundBatch needs samples >= 1, got {samples}")
        if not (isinstance(groups, (int, np.integer)) and groups >= 1):
            raise CaramelError(f"RoundBatch needs groups >= 1 (an integer), got {groups!r}")
        self.groups = int(groups)
        self.inst, self.n, self.k = inst, samples, inst.num_nodes
        self.tables = tb = tables if tables is not None else StepTables(inst, reference=True)
        t_count, lmax = tb.weights_mb.shape
        self.prev = np.tile(tb.source, (samples, 1))
        self._free_ext = np.full((samples, self.k), np.inf)
        self._free_ext[:, :-1] = inst.memory_mb
        self.nodes = np.full((samples, t_count, lmax), -1)
        self.layer, self.placed, self.total_layers = 0, 0, int(tb.num_layers.sum())
        self._group = 0  # the group of the round to observe next
        # zeroed as placed (per sample: with groups, the layers placed so far differ by sample)
        self._left_mb = np.tile(tb.weights_mb.reshape(1, -1), (samples, 1))
        self._next_layer = np.zeros((samples, t_count), dtype=int)  # each task's next layer (capped below)
        self._wish_table = self._make_wish_table(tb)
        self.scale_s, self.mean_mb = scale_and_mean_mb(inst, tb)
        self._static = static_features(tb, inst, self.scale_s, self.mean_mb)
        self._step_scaled = tb.step / self.scale_s
        self._row_pos = np.arange(self.k) / self.k
        self._memory_ext = np.maximum(np.append(inst.memory_mb, 1.0), 1e-9)
        self._samples = np.arange(samples)[:, None]

    def _make_wish_table(self, tb: StepTables) -> np.ndarray:
        return wish_table(tb, self.k, reference=True)

    @property
    def done(self) -> bool:
        return self.placed == self.total_layers

    @property
    def free_mb(self) -> np.ndarray:
        return self._free_ext[:, :-1]

    def _scores(self, tasks: np.ndarray) -> np.ndarray:
        """(S, A, K): the tasks' (S, A) layer-r lookahead scores now, inf where a node lacks room."""
        tb, r = self.tables, self.layer
        need = tb.weights_mb[tasks, r]
        base = tb.step[tasks, r, self.prev[self._samples, tasks]] + tb.h[tasks, r]
        fits = np.ones(base.shape, dtype=bool)
        fits[..., :-1] = need[..., None] <= self.free_mb[:, None, :] + MEMORY_SLACK_MB
        return np.where(fits, base, np.inf)

    def _start_round(self) -> None:
        """The round's tasks (`self.active`) and, with groups, each sample's tasks in settling
        order (`_round_tasks`, (S, A)) and where its groups end."""
        tb, r = self.tables, self.layer
        self.active = act = np.flatnonzero(tb.num_layers > r)
        tasks = np.broadcast_to(act, (self.n, len(act)))
        ends = np.cumsum([len(g) for g in np.array_split(np.arange(len(act)), min(self.groups, len(act)))])
        self._ends = [0] + [int(e) for e in ends]
        if self.groups > 1:
            ordered = np.sort(self._scores(tasks), axis=2)
            with np.errstate(invalid="ignore"):
                regret = np.where(np.isfinite(ordered[..., 1]), ordered[..., 1] - ordered[..., 0], np.inf)
            tasks = np.take_along_axis(tasks, np.argsort(-regret, axis=1, kind="stable"), axis=1)
        self._round_tasks = tasks

    def observe(self) -> np.ndarray:
        """(S, A, K, F) float32, A the tasks of the round's next group (`self.tasks`, (S, A):
        with one group, every task with a layer r, by index; with more, that group's tasks in
        settling order): each the `PlacementEnv` observation of that task at the group's start
        (tested equal)."""
        tb, r, rows = self.tables, self.layer, self._samples
        if self._group == 0:
            self._start_round()
        self.tasks = tk = self._round_tasks[:, self._ends[self._group]:self._ends[self._group + 1]]
        prev = self.prev[rows, tk]  # (S, A)
        self._need = need = tb.weights_mb[tk, r]
        self.scores = s = self._scores(tk)
        self.order = o = np.argsort(s, axis=2, kind="stable")
        scores = np.take_along_axis(s, o, axis=2)
        best, second = scores[..., :1], scores[..., 1:2]
        ta = tk[..., None]
        obs = self._static[ta, r, o]
        obs[..., 1] = self._row_pos
        obs[..., 2] = self._step_scaled[ta, r, prev[..., None], o]
        with np.errstate(invalid="ignore", divide="ignore"):
            self.regret = np.where(np.isfinite(second[..., 0]), second[..., 0] - best[..., 0], np.inf)
            regret = np.where(np.isfinite(second), (second - best) / self.scale_s, 10.0)
            left_mb = np.cumsum(self._left_mb, axis=1)[:, -1]  # left to right, as sum()
            wish = self._wish_table[np.arange(len(tb.num_layers))[None, :],
                                    np.minimum(self._next_layer, tb.num_layers[None, :]), self.prev]
            wished = np.sum(wish, axis=1)[rows[..., None], o]
            cloud_score = s[..., self.inst.cloud][..., None]
            ok = np.isfinite(scores)
            edge = o != self.inst.cloud
            free = self._free_ext[rows[..., None], o]
            room = np.maximum(free, 1e-9)
            needc = need[..., None]
            obs[..., 0] = ok
            obs[..., 4] = np.where(ok, np.minimum((scores - best) / self.scale_s, 10.0), 10.0)
            obs[..., 7] = np.minimum(np.log1p(free / needc), 10.0)
            obs[..., 8] = np.where(edge, free / self._memory_ext[o], 1.0)
            obs[..., 9] = np.minimum(np.log1p(left_mb / np.maximum(self.free_mb.sum(axis=1), 1e-9)),
                                     10.0)[:, None, None]
            obs[..., 10] = np.minimum(regret, 10.0)
            obs[..., 11] = self.placed / self.total_layers
            obs[..., 13] = np.where(edge, np.minimum(np.log1p(wished / room), 10.0), 0.0)
            obs[..., 14] = np.where(edge & ok, (cloud_score - scores) / self.scale_s * self.mean_mb / needc, 0.0)
            obs[..., 17] = np.where(edge, np.minimum(np.log1p(tb.weights_from_mb_table[tk, r][..., None] / room),
                                                     10.0), 0.0)
        return obs

    def priority(self) -> np.ndarray:
        """(S, A): the group's settling order, greedy_regret's at the round's start (most regret
        first; ties: the lowest task); with groups `self.tasks` is already in that order."""
        if self.groups > 1:
            return np.broadcast_to(np.arange(self.tasks.shape[1]), self.tasks.shape)
        return np.argsort(-self.regret, axis=1, kind="stable")

    def step(self, actions: np.ndarray) -> np.ndarray:
        """Place layer r of every active task on the node of its row `actions[s, a]` (a row
        without room: row 0), memory settled by `commit`; the nodes (S, A)."""
        if not hasattr(self, "order"):
            raise CaramelError("RoundBatch.step: call observe() first (it orders the round's nodes)")
        tk, r, rows = self.tasks, self.layer, self._samples
        a = np.asarray(actions, dtype=int)
        if a.shape != tk.shape or (a < 0).any() or (a >= self.k).any():
            raise CaramelError(f"actions must be {tk.shape} rows in 0..{self.k - 1}, got {actions!r}")
        node = np.take_along_axis(self.order, a[..., None], axis=2)[..., 0]
        bad = ~np.isfinite(np.take_along_axis(self.scores, node[..., None], axis=2)[..., 0])
        node = np.where(bad, self.order[..., 0], node)
        node = commit(node, self.priority(), self.order, self._need, self._free_ext)
        self.nodes[rows, tk, r] = node
        self.prev[rows, tk] = node
        self._left_mb[rows, tk * self.tables.weights_mb.shape[1] + r] = 0.0
        self._next_layer[rows, tk] = r + 1
        self.placed += tk.shape[1]
        self._group += 1
        if self._group == len(self._ends) - 1:  # the round's last group: the next observe starts a round
            self._group = 0
            self.layer += 1
        del self.order
        return node

    def costs_s(self) -> np.ndarray:
        """(S,) each finished placement's `Instance.cost_s`: the same table entries, summed task
        by task, layer by layer, left to right (cumsum), as that method sums them."""
        tb = self.tables
        t_count, lmax = tb.weights_mb.shape
        prev = np.concatenate([np.tile(tb.source[None, :, None], (self.n, 1, 1)), self.nodes[..., :-1]], axis=2)
        steps = tb.step[np.arange(t_count)[None, :, None], np.arange(lmax)[None, None, :], prev, self.nodes]
        steps = np.where(self.nodes >= 0, steps, 0.0)  # padding past a shorter task's end
        return np.cumsum(steps.reshape(self.n, -1), axis=1)[:, -1]

    def placements(self) -> list[list[list[int]]]:
        return [[[int(x) for x in self.nodes[i, t, :n]] for t, n in enumerate(self.tables.num_layers)]
                for i in range(self.n)]


def decode_rounds(inst: Instance, policy, decoding: Decoding, seed: int = 0, groups: int = 1,
                  search: SearchOptions | None = None, focus: float | None = None) -> Decoded:
    """The policy decoded in rounds: `policy` a `fast_decode.NumpyPolicy` (the fast decoder: the
    numpy forward pass on `fast_rounds.FastRoundBatch`'s vectorized tables) or the trained torch
    policy (the reference: `RoundBatch` on tables built task by task, probabilities through
    torch; both decide the same, tested). Sample 0 greedy, the others drawn from a torch generator seeded with `seed`; the
    cheapest kept (ties: the lowest sample, so greedy). `groups`: forward passes per round.
    `search`: the kept placement then improved by `local_search.local_search` (on the decoder's
    own tables; `cost_s` is then the improved cost, `costs_s` the samples' before it, `searched`
    what the search did). `focus` (with `search`): a guided search, the fraction of layers the
    policy was least sure of (the lowest probability of the node each ended on, after `commit`)
    tried first (`local_search`'s `focus`); None: every layer from the first pass."""
    from caramel.sched.placement.fast_decode import NumpyPolicy
    from caramel.sched.placement.fast_rounds import FastRoundBatch

    if not isinstance(decoding, Decoding):
        raise CaramelError(f"decoding must be a Decoding (parse_decoding('sample:16')), got {decoding!r}")
    if search is not None and not isinstance(search, SearchOptions):
        raise CaramelError(f"search must be a SearchOptions or None, got {search!r}")
    if focus is not None and not (search is not None and isinstance(focus, numbers.Real)
                                  and not isinstance(focus, bool) and 0 < focus <= 1):
        raise CaramelError(f"focus must be a fraction of the layers in (0, 1], with a search, got {focus!r}"
                           + ("" if search is not None else " and no search"))
    if isinstance(policy, NumpyPolicy):
        probabilities = policy.probabilities
        batch_class = FastRoundBatch
    elif hasattr(policy, "get_distribution"):
        def probabilities(obs):
            return step_probabilities(policy, obs).numpy()
        batch_class = RoundBatch
    else:
        raise CaramelError(f"policy must be a NumpyPolicy or a trained CandidatePolicy, got {policy!r}")
    gen = torch.Generator().manual_seed(int(seed))
    batch = batch_class(inst, decoding.samples, groups=groups)
    sure = np.ones(batch.nodes.shape, dtype=np.float32) if focus is not None else None
    while not batch.done:
        obs = batch.observe()
        s_count, a_count, k, f = obs.shape
        probs = probabilities(obs.reshape(s_count * a_count, k, f))
        actions = np.argmax(probs, axis=1)  # the first most probable row, as torch's argmax
        if s_count > 1:
            actions[a_count:] = torch.multinomial(torch.from_numpy(np.ascontiguousarray(probs[a_count:])), 1,
                                                  generator=gen).squeeze(1).numpy()
        order, tasks, layer = batch.order, batch.tasks, batch.layer
        node = batch.step(actions.reshape(s_count, a_count))
        if sure is not None:  # the probability of the row of the node each layer ended on
            row = np.argmax(order == node[..., None], axis=2)
            p = np.take_along_axis(probs.reshape(s_count, a_count, k), row[..., None], axis=2)[..., 0]
            sure[batch._samples, tasks, layer] = p
    costs = batch.costs_s()
    best = int(np.argmin(costs))
    flat = batch.nodes.reshape(batch.n, -1)
    distinct = len(np.unique(flat, axis=0)) if batch.n > 1 else 1
    placement = batch.placements()[best] if batch.n == 1 else [
        [int(x) for x in batch.nodes[best, t, :n]] for t, n in enumerate(batch.tables.num_layers)]
    cost_s = float(costs[best])
    if search is not None:
        mask = None
        if sure is not None:  # the least sure layers, ties by position (a stable sort: deterministic)
            valid = np.arange(sure.shape[2])[None, :] < batch.tables.num_layers[:, None]
            flat = np.where(valid, sure[best], np.inf).ravel()
            count = max(1, int(round(focus * int(valid.sum()))))
            mask = np.zeros(flat.shape, dtype=bool)
            mask[np.argsort(flat, kind="stable")[:count]] = True
            mask = mask.reshape(valid.shape)
        found = local_search(inst, placement, search, tables=batch.tables, focus=mask)
        placement, cost_s = found.placement, found.cost_s
        return Decoded(placement, cost_s, best, [float(c) for c in costs], distinct, found)
    return Decoded(placement, cost_s, best, [float(c) for c in costs], distinct)
