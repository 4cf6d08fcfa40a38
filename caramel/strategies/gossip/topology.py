"""Mixing matrices of the gossip topologies: pure functions of (topology, world size, step).

Row i of a mixing matrix W holds the weights worker i gives to each worker's parameters when it
mixes: x_i <- sum_j W[i, j] x_j. Every matrix here is doubly stochastic (rows and columns sum
to 1), so mixing keeps the workers' average and, on a connected graph, drives every worker to
it. How fast is the *rate*: the spectral norm of W - J (J = the all-1/n matrix), the factor by
which the distance to the average shrinks at least, per step; 1 - rate is the spectral gap.

- `ring`: each worker mixes with its two neighbours, 1/3 each (1/2 with two workers).
- `torus`: a rows x cols grid with wrap-around (rows the largest divisor <= sqrt(n)); uniform
  weights over itself and its distinct neighbours.
- `exponential`: BlueFog's static exponential-2 graph: worker i sends to i + 2^k for every
  2^k < n; uniform weights 1/(peers + 1).
- `one_peer_exponential`: time-varying: at step t each worker sends to i + 2^(t mod m)
  (m = ceil(log2 n)) and averages with the one it receives from; with n a power of two, m steps
  in a row average exactly.
- `complete`: every worker 1/n (exact averaging, all-reduce's result).
- a JSON file, or from Python a tensor, array or list of rows: the user's matrix, checked
  (`check_mixing`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caramel.errors import CaramelError

TOL = 1e-6


def _circulant(n: int, offsets: list[int]) -> np.ndarray:
    """Worker i receives from i - o for each offset o (and keeps its own), uniform weights."""
    W = np.zeros((n, n))
    w = 1.0 / (len(offsets) + 1)
    for i in range(n):
        W[i, i] += w
        for o in offsets:
            W[i, (i - o) % n] += w
    return W


def _exp_offsets(n: int) -> list[int]:
    return [2 ** k for k in range(max(1, math.ceil(math.log2(n))))] if n > 1 else []


def period(topology: str | list, n: int) -> int:
    """Steps after which a time-varying topology repeats (1 for static ones)."""
    return len(_exp_offsets(n)) if topology == "one_peer_exponential" and n > 1 else 1


def torus_shape(n: int) -> tuple[int, int]:
    rows = max(r for r in range(1, int(math.isqrt(n)) + 1) if n % r == 0)
    return rows, n // rows


def mixing_matrix(topology: str | list, n: int, step: int = 0) -> np.ndarray:
    """The n x n mixing matrix of `topology` at `step` (a .json name is read from the file; a
    list of rows is the matrix itself)."""
    if n < 1:
        raise CaramelError(f"gossip needs at least one worker, got {n}")
    if isinstance(topology, list):
        try:
            W = np.array(topology, dtype=float)
        except (TypeError, ValueError):
            raise CaramelError(f"topology: expected a matrix of {n} rows of {n} numbers") from None
        check_mixing(W, n, source="topology matrix")
        return W
    if topology.endswith(".json"):
        return load_matrix(topology, n)
    if n == 1:
        return np.ones((1, 1))
    if topology == "complete":
        return np.full((n, n), 1.0 / n)
    if topology == "ring":
        return _circulant(n, [1] if n == 2 else [1, -1 % n] if n > 2 else [])
    if topology == "exponential":
        return _circulant(n, _exp_offsets(n))
    if topology == "one_peer_exponential":
        offs = _exp_offsets(n)
        return _circulant(n, [offs[step % len(offs)]])
    if topology == "torus":
        rows, cols = torus_shape(n)
        W = np.zeros((n, n))
        for i in range(n):
            r, c = divmod(i, cols)
            peers = {((r + dr) % rows) * cols + (c + dc) % cols for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))}
            peers.discard(i)
            for j in peers | {i}:
                W[i, j] = 1.0 / (len(peers) + 1)
        return W
    raise CaramelError(f"unknown topology {topology!r}")


def load_matrix(path: str, n: int) -> np.ndarray:
    """A user's mixing matrix from a JSON file (a list of n rows of n weights), checked."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CaramelError(f"topology {path}: cannot read a mixing matrix ({e}); expected a JSON list of rows") from None
    try:
        W = np.array(raw, dtype=float)
    except (TypeError, ValueError):
        raise CaramelError(f"topology {path}: expected a JSON list of {n} rows of {n} numbers") from None
    check_mixing(W, n, source=f"topology {path}")
    return W


def check_mixing(W: np.ndarray, n: int, source: str = "mixing matrix", require_connected: bool = True) -> None:
    """A clear error unless W is n x n, non-negative, doubly stochastic and (unless one step of a
    time-varying topology, connected only over its period) connected."""
    if W.shape != (n, n):
        raise CaramelError(f"{source}: expected a {n} x {n} matrix for {n} workers, got shape {tuple(W.shape)}")
    if not np.isfinite(W).all():  # NaN compares false with every tolerance below
        raise CaramelError(f"{source}: weights must be finite numbers (found {W[~np.isfinite(W)][0]:g})")
    if (W < -TOL).any():
        raise CaramelError(f"{source}: weights must be >= 0 (found {W.min():g})")
    rows, cols = W.sum(axis=1), W.sum(axis=0)
    if np.abs(rows - 1).max() > TOL or np.abs(cols - 1).max() > TOL:
        bad = "row" if np.abs(rows - 1).max() > TOL else "column"
        k = int(np.argmax(np.abs((rows if bad == "row" else cols) - 1)))
        raise CaramelError(f"{source}: not doubly stochastic: {bad} {k} sums to "
                           f"{(rows if bad == 'row' else cols)[k]:g}, every row and column must sum to 1")
    if require_connected and not connected(W):
        raise CaramelError(f"{source}: the graph is not connected, so the workers can never agree")


def connected(W: np.ndarray) -> bool:
    """Whether the graph of W's non-zero weights (either direction) links every worker."""
    n = W.shape[0]
    adj = (W > TOL) | (W.T > TOL)
    seen, todo = {0}, [0]
    while todo:
        i = todo.pop()
        for j in np.nonzero(adj[i])[0]:
            if int(j) not in seen:
                seen.add(int(j))
                todo.append(int(j))
    return len(seen) == n


def rate(W: np.ndarray) -> float:
    """||W - J||_2: the distance to the average shrinks at least by this factor per mix."""
    n = W.shape[0]
    return float(np.linalg.norm(W - np.full((n, n), 1.0 / n), 2))


@dataclass(frozen=True)
class Neighbours:
    """One worker's part of a mixing step: its own weight, whom it receives from (with weights),
    whom it sends to."""

    self_weight: float
    recv: tuple[tuple[int, float], ...]
    send: tuple[int, ...]


def neighbours(W: np.ndarray, rank: int) -> Neighbours:
    n = W.shape[0]
    recv = tuple((j, float(W[rank, j])) for j in range(n) if j != rank and W[rank, j] > TOL)
    send = tuple(j for j in range(n) if j != rank and W[j, rank] > TOL)
    return Neighbours(float(W[rank, rank]), recv, send)


def describe(topology: str | list, n: int) -> dict:
    """What a report says about a topology: peers per step, per-step rate and spectral gap, and
    for a time-varying one the rate of one whole period (per step, as a geometric mean)."""
    p = period(topology, n)
    mats = [mixing_matrix(topology, n, t) for t in range(p)]
    prod = np.eye(n)
    for W in mats:
        prod = W @ prod
    per_period = rate(prod) ** (1.0 / p) if n > 1 else 0.0
    step_rate = max(rate(W) for W in mats)
    return {"topology": topology if isinstance(topology, str) else "matrix", "workers": n, "period_steps": p,
            "peers_per_step": max(len(neighbours(W, i).send) for W in mats for i in range(n)),
            "rate_per_step": step_rate, "spectral_gap": max(0.0, 1.0 - step_rate),
            "rate_per_step_over_period": per_period}
