"""Improving a finished placement by moves whose gains are computed for every layer at once.

A decoded placement (the round policy's: round-mates chose without seeing each other, so the
memory they contest is often given to the wrong layers) is improved by two kinds of move:
  relocate  one layer to another node with room for it;
  exchange  a layer Y onto edge node e while a layer X on e leaves, if Y fits in the room X
            leaves: X to its best other node with room now (the cloud always has), or
            with `swaps` also to Y's node, if X fits in the room Y leaves there (a swap of
            two layers between two full edge nodes). The moves that re-allocate memory
            that is full.
A layer's cost given its chain neighbours is its own step plus its successor's (the tables'
`step`), so the gain of moving it to each node is a (T, L, K) array built by a few gathers.
Each pass computes every relocation with room and every exchange whose memory fits as one array
of gains (an exchange: the better of X's two destinations), applies the `moves_per_pass` best
in gain order (skipping a move whose task an earlier move of the pass changed, or whose memory
no longer fits), and repeats until no move gains more than `min_gain` of the starting cost, or
`max_passes`. Every applied move lowers the cost and
keeps every node within its memory (tested), so the result is never worse than the input.
Exchanges pair layers of different tasks only (two layers of one task would change each
other's neighbours).
A `focus` mask guides it: while the mask's layers have a gaining move only they move as Y (any
edge layer may be X), each moved layer's chain neighbours joining the mask; then every layer, as
without one, so it ends at a local optimum of the same neighbourhood, not necessarily the same
one. Tried to let the policy's least sure layers go first (measured no better than a random
mask, docs/rl-scheduling.md).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from caramel.errors import CaramelError, is_int
from caramel.sched.placement.heuristics import MEMORY_SLACK_MB
from caramel.sched.placement.problem import Instance
from caramel.sched.placement.tables import StepTables


@dataclass(frozen=True)
class SearchOptions:
    """`max_passes`: a bound on the passes; `moves_per_pass`: the best moves each pass tries;
    `min_gain`: a move must gain more than this fraction of the starting cost; `swaps`: an
    exchange may also send X to Y's node (a swap between two full edge nodes; a larger
    neighbourhood, measured better and slower, so off by default)."""

    max_passes: int = 64
    min_gain: float = 1e-9
    """a fraction of the starting cost (0.01: 1%), not seconds; the name is the `--search` key"""
    moves_per_pass: int = 32
    swaps: bool = False

    def __post_init__(self) -> None:
        for name, low in (("max_passes", 0), ("moves_per_pass", 1)):
            value = getattr(self, name)
            if not (is_int(value) and value >= low):
                raise CaramelError(f"{name} must be an integer >= {low}, got {value!r}")
        if not (isinstance(self.min_gain, numbers.Real) and not isinstance(self.min_gain, bool)
                and self.min_gain >= 0):
            raise CaramelError(f"min_gain must be a number >= 0 (a fraction of the starting cost), got {self.min_gain!r}")
        if not isinstance(self.swaps, bool):
            raise CaramelError(f"swaps must be true or false, got {self.swaps!r}")


@dataclass
class Searched:
    """The improved placement, its cost, and what the search did: `passes` run, `moves`
    applied, `converged` (the last pass found no move gaining more than `min_gain`; False when
    `max_passes` stopped it first); `guided_passes`: of the passes, those that applied moves of
    the focus layers alone (0 without a focus)."""

    placement: list[list[int]]
    cost_s: float
    passes: int
    moves: int
    converged: bool
    guided_passes: int = 0


def _check_tables(tb, inst: Instance) -> None:
    """`tables` must be `StepTables(inst)`: checked by shape and by the layers' weights and the
    tasks' sources (a cheap fingerprint; another instance's tables would give wrong costs)."""
    if not isinstance(tb, StepTables):
        raise CaramelError(f"tables must be the instance's StepTables, got {type(tb).__name__}")
    lengths = [len(t.gflop) for t in inst.tasks]
    weights = np.zeros(tb.weights_mb.shape)
    same = list(tb.num_layers) == lengths and tb.step.shape[2:] == (inst.num_nodes, inst.num_nodes)
    if same:
        for t, task in enumerate(inst.tasks):
            weights[t, :len(task.weights_mb)] = task.weights_mb
        same = np.array_equal(weights, tb.weights_mb) and list(tb.source) == [t.source for t in inst.tasks]
    if not same:
        raise CaramelError("tables were built for another instance (their shape, layer weights or sources "
                           "differ); pass StepTables(inst) or none")


def _to_array(tb: StepTables, placement: list[list[int]]) -> np.ndarray:
    t_count, lmax = tb.weights_mb.shape
    nodes = np.full((t_count, lmax), -1)
    if len(placement) != t_count:
        raise CaramelError(f"placement must have one node list per task ({t_count}), got {len(placement)}")
    for t, row in enumerate(placement):
        if len(row) != tb.num_layers[t]:
            raise CaramelError(f"placement of task {t} must have {tb.num_layers[t]} nodes, got {len(row)}")
        k = tb.step.shape[2]
        for layer, n in enumerate(row):
            if not (is_int(n) and 0 <= n < k):
                raise CaramelError(f"placement[{t}][{layer}] must be a node, an integer in 0..{k - 1}, got {n!r}")
        nodes[t, :len(row)] = row
    return nodes


def _costs(tb: StepTables, nodes: np.ndarray, valid: np.ndarray, has_next: np.ndarray) -> np.ndarray:
    """(T, L, K): each layer's step plus its successor's step, were the layer on each node."""
    t_count, lmax = nodes.shape
    k = tb.step.shape[2]
    ti = np.arange(t_count)[:, None]
    li = np.arange(lmax)[None, :]
    prev = np.concatenate([tb.source[:, None], nodes[:, :-1]], axis=1)
    prev = np.where(valid, prev, 0)
    own = tb.step[ti, li, prev]  # (T, L, K): layer l on each node after its predecessor
    nxt = np.where(has_next, np.concatenate([nodes[:, 1:], nodes[:, -1:]], axis=1), 0)
    l1 = np.minimum(li + 1, lmax - 1)
    succ = tb.step[ti[..., None], l1[..., None], np.arange(k)[None, None, :], nxt[..., None]]
    return own + np.where(has_next[..., None], succ, 0.0)


def _total_s(tb: StepTables, nodes: np.ndarray, valid: np.ndarray) -> float:
    """`Instance.cost_s` from the tables: the same entries, summed in its order (cumsum)."""
    t_count, lmax = nodes.shape
    prev = np.concatenate([tb.source[:, None], nodes[:, :-1]], axis=1)
    steps = tb.step[np.arange(t_count)[:, None], np.arange(lmax)[None, :], np.where(valid, prev, 0),
                    np.where(valid, nodes, 0)]
    return float(np.cumsum(np.where(valid, steps, 0.0).ravel())[-1])


def _room_after(free_mb: np.ndarray, w: np.ndarray, y: tuple, y_from: int, e: int, x: tuple | None, x_to: int,
                cloud: int, at_once: bool) -> np.ndarray | None:
    """The free memory after moving Y from `y_from` to `e` (and X from `e` to `x_to`), or None
    where a node would overflow, against the running free memory (an earlier move of the pass
    may have taken the room this one's gain assumed). `at_once` (with swaps): every change
    made, then every node checked, so a swap's X can take the room Y leaves; else X's room is
    checked before Y leaves (the search without swaps, as measured)."""
    room_mb = free_mb.copy()
    if at_once:
        room_mb[y_from] += w[y]
        room_mb[e] -= w[y]
        if x is not None:
            room_mb[e] += w[x]
            room_mb[x_to] -= w[x]
        return None if (room_mb[:-1] < -MEMORY_SLACK_MB).any() else room_mb
    if x is not None:
        if x_to != cloud and w[x] > room_mb[x_to] + MEMORY_SLACK_MB:
            return None
        room_mb[e] += w[x]
        room_mb[x_to] -= w[x] if x_to != cloud else 0.0
    if e != cloud and w[y] > room_mb[e] + MEMORY_SLACK_MB:
        return None
    if e != cloud:
        room_mb[e] -= w[y]
    if y_from != cloud:
        room_mb[y_from] += w[y]
    return room_mb


def _candidates(gain: np.ndarray, out: np.ndarray, out_gain: np.ndarray, nodes: np.ndarray, valid: np.ndarray,
                free_mb: np.ndarray, w: np.ndarray, threshold: float, options: SearchOptions,
                focus: np.ndarray | None) -> tuple:
    """A pass's moves: relocations, every (layer, node) with room; exchanges, Y onto the node of
    an edge layer X of another task, when the room X leaves fits Y, X either to its best other
    node with room now or to Y's node (a swap), when the room Y leaves there fits X. With
    `focus` only its layers move as Y (X may be any edge layer). Returns the relocations' gains
    (T*L, K), the Y and X flat indices, which exchanges are swaps, every move's gain (the
    relocations', then the exchanges' (Y, X) row by row) and the moves gaining > `threshold`."""
    t_count, lmax, k = gain.shape
    cloud = k - 1
    reloc = out.reshape(-1, k)
    flat_gain = gain.reshape(-1, k)
    x_best = gain.max() if options.swaps else out_gain.max()  # the most an X can gain
    may_move = flat_gain[:, :-1].max(axis=1) > threshold - x_best
    if focus is not None:
        reloc = np.where(focus.reshape(-1, 1), reloc, -np.inf)
        may_move &= focus.ravel()
    ys = np.flatnonzero(may_move)
    xs = np.flatnonzero((valid & (nodes != cloud)).ravel())
    ex = np.full((0, 0), -np.inf)
    swap = np.zeros((0, 0), dtype=bool)
    if ys.size and xs.size:
        task_of = np.repeat(np.arange(t_count), lmax)
        x_node, y_node = nodes.ravel()[xs], nodes.ravel()[ys]
        wy, wx = w.ravel()[ys][:, None], w.ravel()[xs][None, :]
        y_in = flat_gain[ys][:, x_node]
        ok = (wy <= free_mb[x_node][None, :] + wx + MEMORY_SLACK_MB) & (task_of[ys][:, None] != task_of[xs][None, :])
        ex = np.where(ok, y_in + out_gain.ravel()[xs][None, :], -np.inf)
        swap = np.zeros(ex.shape, dtype=bool)
        if options.swaps:  # X onto Y's node: -inf where that is X's own node; not the cloud
            onto = flat_gain[xs][:, y_node].T  # (X's way out covers the cloud)
            fits_x = (wx <= free_mb[y_node][:, None] + wy + MEMORY_SLACK_MB) & (y_node != cloud)[:, None]
            swapped = np.where(ok & fits_x, y_in + onto, -np.inf)
            swap = swapped > ex
            ex = np.where(swap, swapped, ex)
    both = np.concatenate([reloc.ravel(), ex.ravel()])
    return reloc, ys, xs, swap, both, np.flatnonzero(both > threshold)


def local_search(inst: Instance, placement: list[list[int]], options: SearchOptions = SearchOptions(),
                 tables: StepTables | None = None, focus: np.ndarray | None = None) -> Searched:
    """`placement` (feasible) improved by relocations and exchanges (see the module).
    `tables`: `StepTables(inst)` if already built (checked against `inst`), else built here.
    `focus` (T, L) bool, one row per task padded to the longest: the layers whose moves are
    tried first (a guided search, see the module); None: every layer from the first pass."""
    if not isinstance(options, SearchOptions):
        raise CaramelError(f"options must be a SearchOptions, got {options!r}")
    if tables is not None:
        _check_tables(tables, inst)
    tb = tables if tables is not None else StepTables(inst)
    nodes = _to_array(tb, placement)
    t_count, lmax = nodes.shape
    if focus is not None:
        focus = np.asarray(focus)
        if focus.dtype != bool or focus.shape != (t_count, lmax):
            raise CaramelError(f"focus must be a ({t_count}, {lmax}) bool array (tasks x the longest task's "
                               f"layers), got {focus.dtype} {focus.shape}")
        focus = focus.copy()
    guided = 0  # passes run on the focus alone
    k, cloud = inst.num_nodes, inst.cloud
    valid = np.arange(lmax)[None, :] < tb.num_layers[:, None]
    has_next = np.arange(lmax)[None, :] + 1 < tb.num_layers[:, None]
    w = tb.weights_mb
    free_mb = np.append(np.asarray(inst.memory_mb, dtype=float), np.inf)
    np.subtract.at(free_mb, nodes[valid & (nodes != cloud)], w[valid & (nodes != cloud)])
    if (free_mb < -1e-9).any():
        raise CaramelError("local_search needs a feasible placement (every edge node within its memory)")
    threshold = options.min_gain * _total_s(tb, nodes, valid)
    passes = moves = 0
    converged = False
    while passes < options.max_passes:
        passes += 1
        c = _costs(tb, nodes, valid, has_next)
        here = np.where(valid, nodes, 0)
        gain = np.take_along_axis(c, here[..., None], axis=2) - c  # (T, L, K): > 0 improves
        fits = np.ones(gain.shape, dtype=bool)
        fits[..., :-1] = w[..., None] <= free_mb[None, None, :-1] + MEMORY_SLACK_MB
        stay = here[..., None] == np.arange(k)
        gain = np.where(valid[..., None] & ~stay, gain, -np.inf)
        # a layer leaving its node: its best other node with room (the cloud always has)
        out = np.where(fits, gain, -np.inf)
        out_gain = out.max(axis=2)
        out_node = out.argmax(axis=2)
        found = _candidates(gain, out, out_gain, nodes, valid, free_mb, w, threshold, options, focus)
        if found[-1].size == 0 and focus is not None:  # the focus is settled: on to every layer
            focus = None
            found = _candidates(gain, out, out_gain, nodes, valid, free_mb, w, threshold, options, None)
        reloc, ys, xs, swap, both, top = found
        if top.size == 0:
            converged = True
            break
        guided += focus is not None
        if top.size > options.moves_per_pass:
            top = top[np.argpartition(-both[top], options.moves_per_pass - 1)[:options.moves_per_pass]]
        top = top[np.argsort(-both[top], kind="stable")]
        cand = []  # (target node, Y's (t, l) flat, X's flat or None, X's node)
        for i in top.tolist():
            if i < reloc.size:
                cand.append((i % k, i // k, None, -1))
            else:
                yi, xi = divmod(i - reloc.size, xs.size)
                x, y = int(xs[xi]), int(ys[yi])
                x_to = int(nodes.ravel()[y]) if swap[yi, xi] else int(out_node.ravel()[x])
                cand.append((int(nodes.ravel()[x]), y, x, x_to))
        touched: set[int] = set()
        applied = 0
        for e, y, x, x_to in cand:
            ty, ly = divmod(y, lmax)
            tasks = {ty} if x is None else {ty, x // lmax}
            if tasks & touched:
                continue  # its gain assumed the task's neighbours as they were
            y_from = int(nodes[ty, ly])
            if x is not None:
                tx, lx = divmod(x, lmax)
            room_mb = _room_after(free_mb, w, (ty, ly), y_from, e, None if x is None else (tx, lx), x_to,
                                  cloud, options.swaps)
            if room_mb is None:
                continue
            if x is not None:
                nodes[tx, lx] = x_to
            nodes[ty, ly] = e
            free_mb = room_mb
            touched |= tasks
            applied += 1
            if focus is not None:  # a moved layer's chain neighbours now gain otherwise: into the focus
                for t_, l_ in [(ty, ly)] + ([] if x is None else [(tx, lx)]):
                    focus[t_, max(l_ - 1, 0):l_ + 2] = True
        moves += applied
        if applied == 0:  # cannot happen (a pass's first candidate always applies); a guard
            converged = True
            break
    final = [[int(n) for n in nodes[t, :tb.num_layers[t]]] for t in range(t_count)]
    return Searched(final, _total_s(tb, nodes, valid), passes, moves, converged, guided)
