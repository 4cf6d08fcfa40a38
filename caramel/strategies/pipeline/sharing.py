"""A pipeline's ranks on a shared host: they compute at once less often than data parallelism's.

A ClusterSpec's worker speeds are the workers' pace with every worker computing at once (the
bench measures them so, and data parallelism runs so). Where `ranks_per_host` workers share a
host's cores, a worker computing while the others idle runs `alone_speedup` times faster
(measured by profiling in turns, `caramel.profile.turns`): processor sharing over
C = ranks_per_host / alone_speedup cores, where a load of k (ranks computing, and transfers,
below) has each computing rank run at min(1, C / k) of its alone pace, that is
min(alone_speedup, n / k) times the all-at-once one.

The load counts what takes the host's CPU while a rank computes. A rank blocked in a recv that
has not started takes none; bytes moving do (the backend's threads and the kernel copy them):
docs/results/pipeline_microbatch_cost/. Each lane with a transfer on the wire counts
w = compute_slowdown - 1 of a computing rank: the bench's `compute_slowdown` is measured with
every rank computing and transferring at once, which processor sharing gives as
(n + n w) / n = 1 + w. So no factor is fitted here; the spec's own measurement is spread over the
ranks whose transfers run. It is the slowest rank's factor (`caramel.bench.contention`), so w
is that rank's rather than the mean, and it is net of the per-collective pause
`collective_cpu_s`, which the stage costs charge per message instead (`planner.message_cpu_s`).
The replay's own beside-the-lane slowdown is then switched off (`scaled`): a lane's own
transfers are in its host's load already.

The choosers (`replicas="auto"`, `stages="auto"`, `microbatches="auto"`) score every candidate
layout so (`settle`, each candidate's own passes at its own factor), the same model the final
prediction runs on the layout they pick: a layout whose ranks transfer more, or compute together
more, is priced with that load before it is picked, not after.

The simulation says which ranks compute and transfer when: `co_computing` is, averaged over all
the lanes' compute time, how many ranks compute at that moment (the lane itself included; each
lane of an equal-replica layout stands for its stage's replicas, which run the same schedule side
by side), `co_transferring` how many lanes have a transfer on the wire then. Every worker then
runs min(alone_speedup, n / k) times its all-at-once speed, k = computing + w x transferring
(below 1 where the load exceeds the all-at-once compute's). That speed moves the timeline, so
the simulation is repeated from the all-at-once speeds until the factor settles (`settle`;
where a cut chosen inside flips between cuts, the slowest of the cycle, marked unsettled).

Two versions of that factor, named by the spec's `sharing_model`
(`caramel.topology.spec.SHARING_MODELS`): "layout", one factor for every rank, from the load
averaged over all the lanes' compute (what every record before the per-stage model was
predicted with, and what a profile without a `model` in its host sharing still gives), and
"stage", each lane its own factor, from the load averaged over that lane's own compute only
(`co_computing_per_lane`, `co_transferring_per_lane`): a long first stage that computes partly
alone runs faster than a short last one that computes only while the others do. Both come from
the same simulated timeline and the run's calibration (`alone_speedup`, `ranks_per_host`,
`compute_slowdown`); nothing is fitted to the scored steps. Not modelled: processor sharing
within a lane's actions (its first forward against its second), the CPU of a transfer by its
rate (a slow link's transfer counts as much as a fast one's), cores that are not alike, and
hosts running unequal shares of a layout's ranks (assumed spread evenly).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence, Union

from caramel.errors import CaramelError
from caramel.sim.simulate import SimResult
from caramel.strategies.pipeline.timeline import PipelineSim
from caramel.topology.spec import ClusterSpec, WorkerSpec

MAX_SHARING_PASSES = 10
SETTLED = 1e-3  # relative change of the factor under which the passes stop
# one factor for every worker ("layout"), or one per worker ("stage": its lane's, `worker_factors`)
Factor = Union[float, Sequence[float]]


def shares_cores(cluster: ClusterSpec) -> bool:
    """Whether `cluster` says its workers share hosts' cores and compute faster alone."""
    return cluster.ranks_per_host > 1 and cluster.alone_speedup > 1.0


def co_computing(spans: list[list[tuple[float, float]]]) -> float:
    """Over all lanes' compute time, the mean number of lanes computing at that moment (>= 1;
    1 where no lane computes). A segment where c lanes compute weighs c x its length and
    counts c: sum(c^2 dt) / sum(c dt)."""
    events = sorted([(a, 1) for lane in spans for a, b in lane if b > a]
                    + [(b, -1) for lane in spans for a, b in lane if b > a])
    num = den = 0.0
    active, last = 0, None
    for t, step in events:
        if last is not None and active and t > last:
            num += active * active * (t - last)
            den += active * (t - last)
        active += step
        last = t
    return num / den if den > 0 else 1.0


def co_transferring(compute: list[list[tuple[float, float]]], wires: list[list[tuple[float, float]]]) -> float:
    """Over all lanes' compute time, the mean number of lanes with a transfer on the wire at
    that moment (0 where no lane computes or none transfers): sum(c t dt) / sum(c dt), c lanes
    computing and t transferring in a segment dt."""
    events = sorted([(a, 1, 0) for lane in compute for a, b in lane if b > a]
                    + [(b, -1, 0) for lane in compute for a, b in lane if b > a]
                    + [(a, 0, 1) for lane in wires for a, b in lane if b > a]
                    + [(b, 0, -1) for lane in wires for a, b in lane if b > a])
    num = den = 0.0
    c = t = 0
    last = None
    for at, dc, dt in events:
        if last is not None and c and at > last:
            num += c * t * (at - last)
            den += c * (at - last)
        c, t, last = c + dc, t + dt, at
    return num / den if den > 0 else 0.0


def _per_lane(compute: list[list[tuple[float, float]]], wires: list[list[tuple[float, float]]]
              ) -> tuple[list[float], list[float]]:
    """Per lane, over its own compute time: the mean number of lanes computing (itself
    included; 1 where it computes nothing) and the mean number with a transfer on the wire."""
    lanes = len(compute)
    events = sorted([(a, 1, 0, p) for p, lane in enumerate(compute) for a, b in lane if b > a]
                    + [(b, -1, 0, p) for p, lane in enumerate(compute) for a, b in lane if b > a]
                    + [(a, 0, 1, p) for p, lane in enumerate(wires) for a, b in lane if b > a]
                    + [(b, 0, -1, p) for p, lane in enumerate(wires) for a, b in lane if b > a])
    on = [0] * lanes  # each lane's compute intervals open now
    c_dt, t_dt, dt_on = [0.0] * lanes, [0.0] * lanes, [0.0] * lanes
    c = t = 0
    last = None
    for at, dc, dt, p in events:
        if last is not None and c and at > last:
            for q in range(lanes):
                if on[q]:
                    c_dt[q] += c * (at - last)
                    t_dt[q] += t * (at - last)
                    dt_on[q] += at - last
        c, t, last = c + dc, t + dt, at
        if dc:
            on[p] += dc
    return ([x / d if d > 0 else 1.0 for x, d in zip(c_dt, dt_on)],
            [x / d if d > 0 else 0.0 for x, d in zip(t_dt, dt_on)])


def co_computing_per_lane(spans: list[list[tuple[float, float]]]) -> list[float]:
    """Per lane, over its own compute time, the mean number of lanes computing at that moment
    (itself included; 1 where it computes nothing). Their mean weighted by each lane's compute
    time is `co_computing`."""
    return _per_lane(spans, [[] for _ in spans])[0]


def co_transferring_per_lane(compute: list[list[tuple[float, float]]],
                             wires: list[list[tuple[float, float]]]) -> list[float]:
    """Per lane, over its own compute time, the mean number of lanes with a transfer on the
    wire (0 where it computes nothing); weighted by compute time, `co_transferring`."""
    return _per_lane(compute, wires)[1]


def lane_meta(sim: PipelineSim, replicas: int | str) -> dict[str, Any]:
    """What the host's load is read from in a replay (`host_ranks_at_once`): each lane's busy
    time (and as the runtime's timer counts it, `PipelineSim.timed_s`), the lanes computing and
    transferring at once, the replicas a lane stands for (`in_step`)."""
    computing, transferring = _per_lane(sim.compute_s, sim.wire_s)
    return {"busy_s_per_lane": sim.busy_s, "timed_busy_s_per_lane": sim.timed_s,
            "co_computing": co_computing(sim.compute_s), "co_transferring": co_transferring(sim.compute_s, sim.wire_s),
            "co_computing_per_lane": computing, "co_transferring_per_lane": transferring, "replicas": replicas}


def candidate_result(sim: PipelineSim, replicas: int | str, **meta: Any) -> SimResult:
    """A chooser's candidate layout replayed, as `settle` reads it (its step and `lane_meta`)."""
    return SimResult(step_time_s=sim.step_time_s, compute_time_s=max(sim.busy_s), comm_time_s=0.0,
                     exposed_comm_s=sim.step_time_s - max(sim.busy_s), wait_time_s=0.0, link_utilization=0.0,
                     comm_busy_fraction=0.0, iteration_times_s=[sim.step_time_s], critical_path={},
                     planner="pipeline candidate", overlap="none", world_size=len(sim.busy_s), num_items=0,
                     meta={**lane_meta(sim, replicas), **meta})


def in_step(sim: SimResult) -> int:
    """How many ranks each simulated lane stands for: equal replicas run one schedule side by
    side (a lane is its stage's replicas); unequal counts' lanes are workers (1)."""
    replicas = sim.meta.get("replicas")
    return replicas if isinstance(replicas, int) and replicas > 1 else 1


def transfer_cpu_share(cluster: ClusterSpec) -> float:
    """What one rank's transfer on the wire takes of its host's CPU, in computing ranks: the
    spec's `compute_slowdown` (every rank computing and transferring) less 1 (module docstring),
    or its meta's `transfer_cpu_share` where the spec's factor is not all CPU: the bench's
    "base" cluster under `--jitter`, whose factor is taken on spans padded with sleeps
    (`caramel.bench.prediction.prediction_clusters`)."""
    share = cluster.meta.get("transfer_cpu_share")
    return max(0.0, share if isinstance(share, (int, float)) else cluster.compute_slowdown - 1.0)


def sharing_factor(ranks_per_host: int, alone_speedup: float, ranks_at_once: float) -> float:
    """How many times its all-at-once speed a rank computes at, a load of `ranks_at_once` of its
    host's ranks (computing, and transfers counted as their CPU share) on average:
    min(alone_speedup, n / k); below 1 where the load exceeds n."""
    return min(alone_speedup, ranks_per_host / max(ranks_at_once, 1.0))


def host_ranks_at_once(sim: SimResult, ranks_per_host: int, transfer_share: float = 0.0) -> float:
    """The load on one host while its ranks compute, from the simulated lanes: the lanes
    computing at once plus `transfer_share` per lane transferring, times the ranks each lane
    stands for, scaled to one host's share of the layout's ranks."""
    lanes = len(sim.meta.get("busy_s_per_lane") or []) or 1
    per_lane = in_step(sim)
    share = min(1.0, ranks_per_host / (lanes * per_lane))
    load = sim.meta.get("co_computing", 1.0) + transfer_share * sim.meta.get("co_transferring", 0.0)
    return load * per_lane * share


def host_ranks_at_once_per_lane(sim: SimResult, ranks_per_host: int, transfer_share: float = 0.0) -> list[float]:
    """`host_ranks_at_once` per lane, over that lane's own compute time (the "stage" model)."""
    computing = sim.meta.get("co_computing_per_lane") or []
    transferring = sim.meta.get("co_transferring_per_lane") or [0.0] * len(computing)
    lanes = len(computing) or 1
    per_lane = in_step(sim)
    share = min(1.0, ranks_per_host / (lanes * per_lane))
    return [(c + transfer_share * t) * per_lane * share for c, t in zip(computing, transferring)]


def worker_factors(sim: SimResult, lane_factors: list[float], workers: int) -> tuple[float, ...]:
    """Each of `workers` workers' factor from its lane's: ranks are laid out stage-major
    (`layout.py`), so worker g runs on lane g // (the ranks a lane stands for, `in_step`);
    a worker beyond the layout's ranks keeps 1 (it runs nothing)."""
    per_lane = in_step(sim)
    return tuple(lane_factors[g // per_lane] if g // per_lane < len(lane_factors) else 1.0 for g in range(workers))


def one_factor(sim: SimResult) -> float:
    """The settled factor of `sim` as one number: itself under "layout", under "stage" the
    per-worker factors' mean weighted by each worker's lane busy time (a worker outside the
    layout weighs nothing). For proposing other layouts (`auto_replicas`): per-worker factors
    belong to this layout's stage-major ranks, and another layout puts other stages there."""
    factor = sim.meta["sharing"]["factor"]
    if isinstance(factor, (int, float)):
        return float(factor)
    busy, per_lane = sim.meta.get("busy_s_per_lane") or [], in_step(sim)
    weights = [busy[g // per_lane] if g // per_lane < len(busy) else 0.0 for g in range(len(factor))]
    total = sum(weights)
    return sum(w * f for w, f in zip(weights, factor)) / total if total > 0 else sum(factor) / len(factor)


def scaled(cluster: ClusterSpec, factor: Factor) -> ClusterSpec:
    """`cluster` with every worker `factor` times faster (one factor, or one per worker) and no
    sharing left to model: neither the host's cores nor a lane's compute beside its own
    transfers (the host's load holds them)."""
    factors = [float(factor)] * cluster.world_size if isinstance(factor, (int, float)) else list(factor)
    if len(factors) != cluster.world_size:
        raise CaramelError(f"sharing: {len(factors)} factors for a cluster of {cluster.world_size} workers")
    workers = [WorkerSpec(w.name, speed=w.speed * f) for w, f in zip(cluster.workers, factors)]
    return dataclasses.replace(cluster, workers=workers, alone_speedup=1.0, ranks_per_host=1, compute_slowdown=1.0)


def with_sharing(simulate: Callable[[ClusterSpec], SimResult], cluster: ClusterSpec) -> SimResult:
    """`simulate(cluster)` at the speeds the sharing settles at (`settle`, each pass on
    `scaled(cluster, factor)`); `simulate(cluster)` itself where workers do not share cores."""
    return settle(lambda factor: simulate(cluster if factor is None else scaled(cluster, factor)), cluster)


def settle(simulate_at: Callable[[Factor | None], SimResult], cluster: ClusterSpec) -> SimResult:
    """`simulate_at(factor)` (every worker `factor` times its all-at-once speed, no sharing left
    to model: `scaled`) at the factor the sharing settles at (`meta["sharing"]`: the factor, the
    host's load while its ranks compute, the passes, whether it settled, a transfer's CPU share,
    the model); `simulate_at(None)`, the spec as given, where workers do not share cores. Under
    `cluster.sharing_model == "stage"` the factor is a tuple, one per worker (its lane's:
    `worker_factors`), and the load one per lane; under "layout" one number each.

    A cut chosen inside `simulate_at` (`partition="auto"`) is chosen at the factor it is given,
    and the cut it picks may give another factor, at which it picks another cut: the passes can
    cycle. A factor seen before (or the pass cap) ends them with `settled: False` and the
    slowest pass of the cycle (of the last two at the cap), so that the answer does not hang on
    where the cap falls, and errs towards the slower layout's pace."""
    if not shares_cores(cluster):
        return simulate_at(None)
    per_stage = cluster.sharing_model == "stage"
    share, n = transfer_cpu_share(cluster), cluster.ranks_per_host
    factor: Any = (1.0,) * cluster.world_size if per_stage else 1.0
    passes: list[tuple[Any, SimResult, Any]] = []  # (factor, its simulation, ranks at once)
    while True:
        sim = simulate_at(factor)
        if per_stage:
            k: Any = host_ranks_at_once_per_lane(sim, n, share)
            nxt: Any = worker_factors(sim, [sharing_factor(n, cluster.alone_speedup, x) for x in k], cluster.world_size)
        else:
            k = host_ranks_at_once(sim, n, share)
            nxt = sharing_factor(n, cluster.alone_speedup, k)
        passes.append((factor, sim, k))
        if _close(nxt, factor):
            cycle, settled = passes[-1:], True
            break
        seen = [i for i, (f, _, _) in enumerate(passes[:-1]) if _close(nxt, f)]
        if seen or len(passes) >= MAX_SHARING_PASSES:
            cycle, settled = passes[seen[-1] if seen else -2:], False
            break
        factor = nxt
    # the slowest; among equal steps the lowest factor, so that the pick is the same whatever the order
    factor, sim, k = max(cycle, key=lambda p: (p[1].step_time_s, tuple(-f for f in _as_tuple(p[0]))))
    # the spec's measurement, not the 1 the passes replayed at (`scaled`)
    sim.meta["compute_slowdown"], sim.meta["replay_compute_slowdown"] = cluster.compute_slowdown, 1.0
    sim.meta["sharing"] = {"factor": list(factor) if per_stage else factor, "ranks_at_once": k, "passes": len(passes),
                           "settled": settled, "transfer_cpu_share": share, "ranks_per_host": n,
                           "alone_speedup": cluster.alone_speedup, "model": cluster.sharing_model}
    return sim


def _as_tuple(factor: Factor) -> tuple[float, ...]:
    return (float(factor),) if isinstance(factor, (int, float)) else tuple(factor)


def _close(a: Factor, b: Factor) -> bool:
    """Whether two factors (numbers, or per-worker tuples) agree within `SETTLED`, each entry."""
    xs, ys = _as_tuple(a), _as_tuple(b)
    return len(xs) == len(ys) and all(abs(x - y) <= SETTLED * y for x, y in zip(xs, ys))
