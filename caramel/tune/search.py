"""Searches over a knob space under a budget of measurements.

`model_guided` is the tuner: a cheap model (`predict`, the simulator) scores every candidate,
corrected by what the measurements so far say (the log ratio measured / predicted fitted by a ridge
regression on the knobs, what it leaves smoothed over measured neighbours in knob space), minus an optimism
bonus where few measurements are near (a confidence bound, so a region the model misjudges
still gets tried). Each round it takes the `pool` best unmeasured candidates so scored, clusters
them (k-means in the knob embedding) and measures the candidate nearest each cluster's centre,
so one round's measurements are diverse rather than `batch` near-copies of one guess. This is
Chameleon's adaptive sampling with the learned cost model replaced by the simulator plus a
correction. `random_search` and `tpe_search` (Optuna) are what users have today; all three
count only distinct measured candidates against the budget.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from caramel.tune.space import Config, Space

Measure = Callable[[Config], float]
RIDGE = 1e-3  # shrinks the correction's trend toward none while few candidates are measured


@dataclass
class Trial:
    config: Config
    measured_s: float
    predicted_s: float | None = None  # the corrected model's prediction when it was chosen


@dataclass
class SearchResult:
    method: str
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial:
        return min(self.trials, key=lambda t: t.measured_s)

    def best_after(self, n: int) -> float:
        """The best measured value among the first n trials."""
        return min(t.measured_s for t in self.trials[:n])

    def trials_to_reach(self, target_s: float) -> int | None:
        """How many measurements it took to first measure <= target_s (None: never)."""
        for i, t in enumerate(self.trials, 1):
            if t.measured_s <= target_s:
                return i
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "trials": [{"config": t.config, "measured_s": t.measured_s,
                                                   "predicted_s": t.predicted_s} for t in self.trials]}


def random_search(space: Space, measure: Measure, budget: int, seed: int = 0) -> SearchResult:
    cands = space.candidates()
    order = random.Random(seed).sample(range(len(cands)), min(budget, len(cands)))
    return SearchResult("random", [Trial(cands[i], measure(cands[i])) for i in order])


def tpe_search(space: Space, measure: Measure, budget: int, seed: int = 0) -> SearchResult:
    """Optuna's TPE over the same knobs; a repeated suggestion is answered from the earlier measurement, free."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), direction="minimize")
    seen: dict[tuple, float] = {}
    result = SearchResult("tpe")
    total = len(space.candidates())
    for _ in range(50 * budget):
        if len(result.trials) >= min(budget, total):
            break
        trial = study.ask()
        config = {k.name: trial.suggest_categorical(k.name, list(k.choices)) for k in space.knobs}
        key = space.key(config)
        if key not in seen:
            seen[key] = measure(config)
            result.trials.append(Trial(config, seen[key]))
        study.tell(trial, seen[key])
    return result


def _kmeans_representatives(points: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """Indices of the points nearest each of k centres (k-means++ start, a few Lloyd steps)."""
    if len(points) <= k:
        return list(range(len(points)))
    centres = [points[rng.integers(len(points))]]
    for _ in range(1, k):
        d = np.min([((points - c) ** 2).sum(1) for c in centres], axis=0)
        centres.append(points[rng.choice(len(points), p=d / d.sum())] if d.sum() > 0 else points[rng.integers(len(points))])
    centres = np.array(centres)
    for _ in range(10):
        labels = np.argmin(((points[:, None, :] - centres[None]) ** 2).sum(2), axis=1)
        centres = np.array([points[labels == j].mean(0) if (labels == j).any() else centres[j] for j in range(k)])
    chosen: list[int] = []
    for c in centres:
        for i in np.argsort(((points - c) ** 2).sum(1)):
            if int(i) not in chosen:
                chosen.append(int(i))
                break
    return chosen


def model_guided(space: Space, predict: Measure, measure: Measure, budget: int, seed: int = 0, batch: int = 2,
                 pool: int = 8, bandwidth: float = 0.25, explore: float = 0.5) -> SearchResult:
    """The tuner; see the module docstring. `bandwidth` is the correction kernel's width in the
    embedding, `explore` how many standard deviations of optimism an unexplored candidate gets."""
    cands = space.candidates()
    emb = np.array([space.embed(c) for c in cands])
    log_pred = np.log(np.array([max(predict(c), 1e-12) for c in cands]))
    rng = np.random.default_rng(seed)
    measured: dict[int, float] = {}
    result = SearchResult("model-guided")
    while len(measured) < min(budget, len(cands)):
        shift, doubt = _correction(emb, log_pred, measured, bandwidth)
        corrected = log_pred + shift
        # optimism where the measurements say little: a candidate far from every measured one may
        # be as much better than the model says as the measured ones have been worse or better
        score = corrected - explore * doubt
        open_ = [i for i in np.argsort(score, kind="stable") if int(i) not in measured]
        top = [int(i) for i in open_[:pool]]
        take = min(batch, budget - len(measured))
        # the best guess always, then one representative per cluster of the rest of the pool
        picks = [top[0]] + ([top[1 + j] for j in _kmeans_representatives(emb[top[1:]], take - 1, rng)] if take > 1 else [])
        for i in picks[:take]:
            measured[i] = measure(cands[i])
            result.trials.append(Trial(cands[i], measured[i], math.exp(corrected[i])))
    return result


def _correction(emb: np.ndarray, log_pred: np.ndarray, measured: dict[int, float],
                bandwidth: float) -> tuple[np.ndarray, np.ndarray]:
    """log(measured / predicted) smoothed over knob space (the measured points' own values
    exactly), and how unsure that is: the residuals' spread, shrinking with nearby measurements."""
    if not measured:
        return np.zeros(len(emb)), np.zeros(len(emb))
    idx = np.array(list(measured))
    resid = np.log(np.array([measured[i] for i in idx])) - log_pred[idx]
    # a global trend (ridge regression of the residual on the knobs) moves the model's optimum
    # toward the measured one; kernel smoothing of what the trend leaves covers local errors
    feats = np.hstack([np.ones((len(emb), 1)), emb, emb ** 2])  # squares: knobs often have a sweet spot
    x = feats[idx]
    coef = np.linalg.solve(x.T @ x + RIDGE * np.eye(x.shape[1]), x.T @ resid)
    trend = feats @ coef
    left = resid - trend[idx]
    d2 = ((emb[:, None, :] - emb[None, idx, :]) ** 2).sum(2)
    w = np.exp(-d2 / (2 * bandwidth ** 2))
    out = trend + (w @ left) / (w.sum(1) + 1.0)  # leftovers shrink toward 0 as one neighbour at distance 0
    out[idx] = resid  # a measured candidate's corrected value is its measurement
    spread = max(float(resid.std()), 0.05) if len(resid) > 1 else 0.1
    doubt = spread / np.sqrt(w.sum(1) + 1.0)
    doubt[idx] = 0.0
    return out, doubt
