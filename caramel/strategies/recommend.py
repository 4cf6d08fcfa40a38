"""Which strategy to run: every candidate simulated on one profile and cluster, the fastest
recommended.

    preds = predict(profile, cluster, candidates(cluster.world_size))
    best = recommend(preds)              # the fastest that trains DDP's parameters

A candidate is a strategy spec (`"ps:order=tac"`); its prediction is the strategy's own
simulator model (the registry's `simulate`), the same one `caramel simulate --strategy` runs,
so `caramel plan --strategy auto` and the bench's per-strategy predictions agree by
construction. Strategies that change the training arithmetic (gossip, stale or asynchronous
parameter servers, asynchronous PipeDream, lossy compression) are predicted like the rest but
recommended only when the caller allows approximate training: a faster step that trains a
different model is not a drop-in replacement for DDP. On a cluster that carries a jitter or
per-worker link rates, a candidate whose simulator ignores that input (`caramel.strategies.reads`)
is predicted and marked, not recommended: its step leaves out what slows it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.strategies import STRATEGIES
from caramel.strategies.pipeline.options import MAX_VIRTUAL_PIPELINES
from caramel.strategies.reads import cluster_inputs, ignored_by
from caramel.topology.spec import ClusterSpec

# Per strategy: does a spec with these options train the same parameters as DDP (up to
# floating-point reordering)? A strategy missing here is treated as approximate.
_EXACT: dict[str, Callable[[Any], bool]] = {
    "ddp": lambda o: True,
    "caramel": lambda o: o.compression in ("none", "off"),
    "ps": lambda o: o.staleness_bound() == 0,
    "pipeline": lambda o: o.schedule != "pipedream",
    "gossip": lambda o: False,
}


@dataclass(frozen=True)
class Prediction:
    """One candidate's simulated step; `error` says why there is none (e.g. the model cannot
    be cut into that many stages)."""

    strategy: str
    step_time_s: float | None
    exact: bool
    error: str | None = None
    plan: dict[str, Any] | None = None
    """what the model chose where the strategy chooses (a pipeline's cut, counts, microbatches)"""
    ignores: list[str] | None = None
    """inputs the cluster carries that this strategy's simulator does not read (`caramel.strategies.reads`):
    its step is predicted as if they were absent, so `recommend` does not rank it"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_exact(spec_text: str) -> bool:
    """Whether the strategy `spec_text` trains DDP's parameters (see `_EXACT`)."""
    spec = STRATEGIES.spec(spec_text)
    rule = _EXACT.get(spec.info.name)
    return bool(rule(spec.options)) if rule is not None else False


def candidates(world_size: int, approximate: bool = False) -> list[str]:
    """The default candidate set for `world_size` workers: DDP, Caramel, a parameter server and
    synchronous pipelines of 2 stages (hybrid with world/2 replicas when that divides; with an
    odd world, unequal replicas: all but one worker on either stage, `unequal.py`, while their
    world - 1 virtual pipelines stay within `MAX_VIRTUAL_PIPELINES`) and of every
    worker; with `approximate`, SSP(2) parameter servers and gossip too: on a ring, and one
    peer per step with 0.5 MB messages mixed at the update (`algorithm=overlap`), the form that
    beat the all-reduce on a slow link and under jitter (docs/gossip.md, "The overlapped mix")."""
    if world_size < 1:
        raise CaramelError(f"world_size must be >= 1, got {world_size}")
    out = ["ddp", "caramel", "ps"]
    if world_size >= 2 and world_size % 2 == 0:
        out.append("pipeline:stages=2" + (f",replicas={world_size // 2}" if world_size > 2 else ""))
    if world_size > 2 and world_size % 2 and world_size - 1 <= MAX_VIRTUAL_PIPELINES:
        # 1F1B needs >= 2 microbatches per virtual pipeline; there are world - 1 of them
        m = 2 * (world_size - 1)
        out += [f"pipeline:stages=2,replicas={world_size - 1}+1,microbatches={m}",
                f"pipeline:stages=2,replicas=1+{world_size - 1},microbatches={m}"]
    if world_size > 2:
        out.append(f"pipeline:stages={world_size},microbatches={max(4, world_size)}")
    if approximate:
        out += ["ps:consistency=ssp:2", "gossip:topology=ring",
                "gossip:topology=one_peer_exponential,bucket_cap_mb=0.5,algorithm=overlap"]
    return out


PLAN_KEYS = ("boundaries", "microbatches", "replicas", "stages", "predicted_slowest_stage_s", "busy_s_per_lane",
             "timed_busy_s_per_lane")
"""a simulation's choices (`SimResult.meta`) a prediction keeps; with "sharing_unsettled_passes"
where its host-sharing passes ended in a cycle (`pipeline.sharing.settle`, `settled` False)"""


def predict(profile: ModelProfile, cluster: ClusterSpec, specs: list[str], iterations: int = 4) -> list[Prediction]:
    """Each spec's simulated step time on `cluster`, in the given order. A malformed spec is an
    error; a spec the simulator cannot model here (too few layers to cut, more servers than
    ranks) is a Prediction with its reason, so the other candidates still count. A spec whose
    simulator ignores an input the cluster carries (a jitter for ps) says so in `ignores`."""
    parsed = [STRATEGIES.spec(text) for text in specs]  # bad input: one clear error before any work
    present = cluster_inputs(cluster)
    out = []
    for text, spec in zip(specs, parsed):
        exact, ignores = is_exact(text), ignored_by(text, present) or None
        try:
            result = spec.simulate(profile, cluster, iterations)
        except CaramelError as e:
            out.append(Prediction(text, None, exact, str(e), ignores=ignores))
            continue
        plan = {k: result.meta[k] for k in PLAN_KEYS if k in (result.meta or {})}
        sharing = (result.meta or {}).get("sharing") or {}
        if sharing.get("settled") is False:  # the host-sharing passes cycled: flagged, not printed like any other
            plan["sharing_unsettled_passes"] = sharing["passes"]
        out.append(Prediction(text, float(result.step_time_s), exact, plan=plan or None, ignores=ignores))
    return out


def recommend(predictions: list[Prediction], approximate: bool = False) -> Prediction | None:
    """The fastest predicted candidate (exact ones only unless `approximate`); None if none
    could be predicted. A prediction that ignores an input of the cluster is not ranked: its
    simulator left out what slows it. Ties go to the candidate listed first (DDP first by default)."""
    pool = [p for p in predictions if p.step_time_s is not None and (approximate or p.exact) and not p.ignores]
    return min(pool, key=lambda p: p.step_time_s) if pool else None
