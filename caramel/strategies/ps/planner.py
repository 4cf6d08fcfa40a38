"""The PS plan: who serves each parameter, the order gradients are pushed and parameters pulled.

Made once from a `ModelProfile` (on rank 0, then broadcast), as data: the push order is the
order gradients become ready (fifo, as DDP reduces them); the pull order is the strategy's
`order` (TicTac's TAC or TIC over the next forward's DAG, fifo, or a per-step random order);
placement assigns every trainable parameter to a server shard, and parameters of one shard are
fused into push buckets (ready order) and pull buckets (need order, a smaller cap;
`buckets.py`): the pull order orders pull buckets, TicTac's over the graph whose recvs are the
pull buckets. `predicted` holds TicTac's E and
S of the order under the time oracle, next to those of fifo, of the registration order and of
random orders (the mean makespan of a few shuffles).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.ps.buckets import bucket_graph, cap_bytes, check_buckets, make_buckets, make_pull_buckets
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.placement import imbalance, place, shard_loads
from caramel.strategies.ps.tictac import efficiency, graph_from_profile, makespan, tac_order, tic_order

DEFAULT_LATENCY_S = 50e-6  # per transfer, when no cluster spec says otherwise
RANDOM_SAMPLES = 16  # shuffles averaged for order="random"'s predicted makespan


@dataclass
class PsPlan:
    """Parameter indices (`model.parameters()` order, tied ones once) throughout."""

    params: list[int]  # the trainable parameters, the ones pushed and pulled
    owner: dict[int, int]  # parameter -> server shard (= the rank serving it)
    push_order: list[int]
    pull_order: list[int]  # for order="random" the first step's; `pull_order_at` gives each step's
    order: str
    seed: int = 0
    shards: int = 1
    predicted: dict[str, Any] = field(default_factory=dict)
    loads: list[dict[str, Any]] = field(default_factory=list)
    placement: str = "balanced"
    buckets: list[list[int]] = field(default_factory=list)  # fused pushes, in push order (each: parameters)
    bucket_pull: list[int] = field(default_factory=list)  # pull bucket ids in pull order (order="random": the first step's)
    pull_buckets: list[list[int]] = field(default_factory=list)  # fused pulls (each: parameters, in need order)

    def __post_init__(self) -> None:
        if not self.buckets:  # a plan made without fusion: one bucket per tensor
            self.buckets = [[i] for i in self.push_order]
            pos = {i: b for b, (i,) in enumerate(self.buckets)}
            self.bucket_pull = [pos[i] for i in self.pull_order]
        if not self.pull_buckets:  # a plan from before pull buckets: pulls move the push buckets
            self.pull_buckets = [list(b) for b in self.buckets]
        check_buckets(self.buckets, self.params, self.owner)
        check_buckets(self.pull_buckets, self.params, self.owner)
        if sorted(self.bucket_pull) != list(range(len(self.pull_buckets))):
            raise CaramelError("ps plan: the pull order must list every pull bucket exactly once")

    def bucket_owner(self, b: int) -> int:
        return self.owner[self.buckets[b][0]]

    def pull_owner(self, b: int) -> int:
        return self.owner[self.pull_buckets[b][0]]

    def bucket_pull_at(self, update: int) -> list[int]:
        """The pull buckets of this update's pulls, in order (a fresh shuffle per update for
        order="random", the same on every rank)."""
        if self.order != "random":
            return self.bucket_pull
        out = list(range(len(self.pull_buckets)))
        random.Random(self.seed * 1_000_003 + update).shuffle(out)
        return out

    def pull_order_at(self, update: int) -> list[int]:
        """The parameters of this update's pulls in the order they go (bucket by bucket)."""
        return [i for b in self.bucket_pull_at(update) for i in self.pull_buckets[b]]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["owner"] = {str(k): v for k, v in self.owner.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PsPlan":
        d = dict(d)
        d["owner"] = {int(k): v for k, v in d["owner"].items()}
        return cls(**d)


def provisional_plan(params: list[int], sizes_bytes: list[int], shards: int, options: PsOptions,
                     kinds: list[str] | None = None) -> PsPlan:
    """Before a profile exists: push in reverse registration order (as backward usually
    produces gradients), pull in registration order, round-robin shards; buckets as the
    options say (`kinds`: each parameter's dtype and device, all alike when not given)."""
    placed = place(sizes_bytes, list(range(len(params))), shards, "roundrobin")
    owner = {i: placed[k] for k, i in enumerate(params)}
    push = list(reversed(params))
    sizes, kind = dict(zip(params, sizes_bytes)), dict(zip(params, kinds or [""] * len(params)))
    buckets = make_buckets(push, owner, sizes, kind, cap_bytes(options.bucket_cap_mb))
    pulls = make_pull_buckets(list(params), owner, sizes, kind, cap_bytes(options.pull_cap_mb()))
    order = list(range(len(pulls)))  # registration order, which is how pulls are listed
    return PsPlan(list(params), owner, push, [i for b in order for i in pulls[b]], order=options.order,
                  seed=options.seed, shards=shards, placement="roundrobin", buckets=buckets, bucket_pull=order,
                  pull_buckets=pulls)


def make_ps_plan(profile: ModelProfile, options: PsOptions, shards: int, latency_s: float = DEFAULT_LATENCY_S,
                 bandwidth_Bps: float | None = None, pull_comm_s: float | None = None,
                 pull_transfers: int | None = None, kinds: dict[int, str] | None = None) -> PsPlan:
    """The plan for `profile`. The time oracle of a recv is latency + bytes / bandwidth; with
    `pull_comm_s` (every pull measured back to back, `pull_transfers` collectives, by default
    one per tensor) the bandwidth is fitted to it. `kinds`: parameter -> dtype and device, which
    a bucket must not mix (the profile's dtype when not given)."""
    sizes = [p.bytes for p in profile.trainable()]
    total = sum(sizes)
    if bandwidth_Bps is None:
        n = len(sizes) if pull_transfers is None else pull_transfers
        if pull_comm_s is not None and pull_comm_s > n * latency_s and total > 0:
            bandwidth_Bps = total / (pull_comm_s - n * latency_s)
        else:
            bandwidth_Bps = 1.25e9  # 10 Gbit/s
    pgraph, index = graph_from_profile(profile, latency_s, bandwidth_Bps)
    need = tac_order(pgraph)  # placement's need order: when the next forward needs each tensor
    owner = place(sizes, need, shards, options.placement)
    fifo = _fifo(profile, index)
    kind = {k: (kinds or {}).get(index[k], profile.params[index[k]].dtype) for k in range(len(index))}
    buckets = make_buckets(fifo, dict(enumerate(owner)), dict(enumerate(sizes)), kind, cap_bytes(options.bucket_cap_mb))
    pulls = make_pull_buckets(need, dict(enumerate(owner)), dict(enumerate(sizes)), kind, cap_bytes(options.pull_cap_mb()))
    graph = bucket_graph(pgraph, pulls, latency_s, bandwidth_Bps, sizes)
    first = [min(b) for b in pulls]  # registration: by each bucket's first-registered tensor
    fifo_pos = {k: p for p, k in enumerate(fifo)}  # fifo: as each pull bucket's gradients are all ready
    orders = {"tac": tac_order(graph), "tic": tic_order(graph),
              "fifo": sorted(range(len(pulls)), key=lambda b: max(fifo_pos[k] for k in pulls[b])),
              "registration": sorted(range(len(pulls)), key=lambda b: first[b])}
    chosen = orders.get(options.order, orders["registration"])
    comm, comp = sum(graph.recv_s), sum(graph.compute_s)
    predicted: dict[str, Any] = {"comm_s": comm, "compute_s": comp, "latency_s": latency_s, "bandwidth_Bps": bandwidth_Bps,
                                 "buckets": len(buckets), "bucket_cap_mb": options.bucket_cap_mb,
                                 "pull_buckets": len(pulls), "pull_bucket_cap_mb": options.pull_cap_mb()}
    for name, order in orders.items():
        m = makespan(graph, order)
        E, S = efficiency(comp, comm, m)
        predicted[name] = {"makespan_s": m, "E": E, "S": S}
    shuffled = [list(range(len(pulls))) for _ in range(RANDOM_SAMPLES)]
    for k, order in enumerate(shuffled):
        random.Random(k).shuffle(order)
    m = sum(makespan(graph, o) for o in shuffled) / RANDOM_SAMPLES
    E, S = efficiency(comp, comm, m)
    predicted["random"] = {"makespan_s": m, "E": E, "S": S}  # the mean of RANDOM_SAMPLES shuffles
    loads = shard_loads(sizes, need, owner, shards)
    predicted["shard_imbalance"] = imbalance(loads)
    return PsPlan([index[k] for k in range(len(index))], {index[k]: owner[k] for k in range(len(index))},
                  [index[k] for k in fifo], [index[k] for b in chosen for k in pulls[b]], order=options.order,
                  seed=options.seed, shards=shards, predicted=predicted,
                  loads=[x.to_dict() for x in loads], placement=options.placement,
                  buckets=[[index[k] for k in b] for b in buckets], bucket_pull=list(chosen),
                  pull_buckets=[[index[k] for k in b] for b in pulls])


def _fifo(profile: ModelProfile, index: list[int]) -> list[int]:
    """Positions in the order gradients become ready (never-ready ones last, by index)."""
    params = profile.params
    return sorted(range(len(index)), key=lambda k: (params[index[k]].ready_order is None,
                                                   params[index[k]].ready_order or 0, index[k]))


def first_plan(params: list[Any], shards: int, options: PsOptions) -> PsPlan:
    """The provisional plan every rank derives alike, until the online profile's."""
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    if not trainable:
        raise CaramelError("strategy 'ps': the model has no trainable parameters; there is nothing to serve")
    return provisional_plan(trainable, [params[i].numel() * params[i].element_size() for i in trainable], shards, options,
                            [kind_of(params[i]) for i in trainable])


def kind_of(p: Any) -> str:
    """What a bucket must share to be concatenated: dtype and device."""
    return f"{p.dtype}@{p.device}"

