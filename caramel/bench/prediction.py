"""The simulator's prediction of every strategy the bench measured, and how good it was.

After the measured rounds the harness has a profile (taken on every worker side by side, or,
in a job with a pipeline, by each host's ranks in turns: `caramel.bench.job_profile`), each
rank's compute-only baseline (the plain training step, no communication) and the link rate the
comm-only baseline achieved (`caramel.bench.lower_bound`). From those alone, never from the
strategies' own measured steps, each strategy's simulator model predicts its step (`caramel.strategies.recommend.predict`, what `caramel plan --strategy auto` and
`caramel simulate --strategy` run). The report sets each prediction beside the measured median,
so the simulator's accuracy is claimed on configurations it was not calibrated on, and checks
the recommendation: is the strategy the simulator ranks fastest the measured fastest, or within
`RECOMMENDATION_TOLERANCE` of it?
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from caramel.bench.contention import job_slowdown
from caramel.bench.hetero_prediction import Heterogeneity
from caramel.bench.traffic_probe import efficiency, efficiency_by_count, pull_efficiency_by_count
from caramel.profile.turns import sharing_of
from caramel.stats import median

RECOMMENDATION_TOLERANCE = 0.05  # the recommended strategy's median may exceed the fastest's by this share
ACCURACY_TARGET = 0.10  # the issues' bar: predicted within 10% of the measured median
PROBE_POINTS, PROBE_REPS = 6, 5  # the bench's link probe: sizes, timed repetitions of each
LINK_FIELDS = ("latency_s", "queued_latency_s", "collective_cpu_s")  # what the job's probe adds to the spec
# what the traffic probe adds to its meta: the ps model reads all six (the by-count curves
# from a probe of version 2, and 4, on), the gossip model push_efficiency
PS_FIELDS = ("link_queue_s", "push_efficiency", "pull_efficiency", "push_efficiency_by_count", "pull_efficiency_by_count",
             "push_receives_early")


def worker_speeds(profile_step_s: float, rank_compute_s: list[float]) -> list[float]:
    """Each rank's speed relative to the profile: the profile's step over the rank's own plain
    step (its compute-only baseline), so that the simulator replays the profile at the pace each
    rank trained at in this job: the host's contention and an emulated slow worker included."""
    return [profile_step_s / c if c > 0 else 1.0 for c in rank_compute_s]


def bench_cluster(world: int, bandwidth_bps: float, speeds: list[float] | None = None,
                  link: dict[str, Any] | None = None, compute_slowdown: float = 1.0,
                  uneven: dict[str, Any] | None = None, sharing: dict[str, Any] | None = None,
                  transfer_cpu_share: float | None = None, layout: dict[str, Any] | None = None):
    """The ClusterSpec a bench configuration ran on, as far as the bench measured it: `world`
    workers at `speeds` (default 1) on links of the achieved rate; `link`: the fixed costs per
    collective the job's probe fitted (`latency_s`, `queued_latency_s`, `collective_cpu_s`;
    None: the spec's defaults) and `PS_FIELDS` (`caramel.bench.traffic_probe`; the spec's meta,
    read by the ps model, and `push_efficiency` by the gossip model too: its concurrent peer
    flows' share of the rate, `caramel.strategies.gossip.links`); `compute_slowdown`: compute's
    slowdown beside the collectives (`caramel.bench.contention`; gossip also slows backward by it
    while its overlapped trackers are on the wire); `uneven`: meta a heterogeneous configuration
    adds (`worker_bandwidth_bps`, `compute_jitter`: `caramel.bench.hetero_prediction`);
    `sharing`: `alone_speedup` and `ranks_per_host` where the ranks share a host's cores
    (`caramel.bench.job_profile.sharing_of`; read by the pipeline simulator only);
    `transfer_cpu_share`: a transfer's CPU share of its host where it is not
    `compute_slowdown` - 1 (meta; `caramel.strategies.pipeline.sharing.transfer_cpu_share`);
    `layout`: several ranks per host (`workers_per_node`, `node_bandwidth_bps`, `backend`; meta, read
    by the ps model's hierarchical=true, `caramel.bench.node_probe`)."""
    from caramel.topology.spec import ClusterSpec, WorkerSpec

    speeds = speeds or [1.0] * world
    if len(speeds) != world:
        raise ValueError(f"{len(speeds)} worker speeds for {world} workers")
    costs = {k: link[k] for k in LINK_FIELDS if link and link.get(k) is not None}
    queue = {k: link[k] for k in PS_FIELDS if link and link.get(k) is not None}
    return ClusterSpec(workers=[WorkerSpec(f"w{i}", speed=s) for i, s in enumerate(speeds)],
                       bandwidth_bps=bandwidth_bps, compute_slowdown=compute_slowdown, **costs, **(sharing or {}),
                       meta={"source": "bench: achieved rate of the comm-only baseline, speeds from each rank's "
                                       "compute-only baseline" + (", fixed costs from the job's probe" if costs else "")
                                       + (", compute slowdown from the concurrent baseline" if compute_slowdown > 1 else "")
                                       + (", host sharing from profiles at once and in turns" if sharing else "")
                                       + (", ps traffic from the job's probe" if queue else "")
                                       + (", ranks per host and the rate within one from the job" if layout else "")
                                       + (", heterogeneity: " + ", ".join(uneven) if uneven else ""),
                             **queue, **(uneven or {}), **(layout or {}),
                             **({} if transfer_cpu_share is None else {"transfer_cpu_share": transfer_cpu_share})})


def prediction_clusters(profile: Any, world: int, bandwidth_bps: float, rank_compute_s: list[float] | None = None,
                        link: dict[str, Any] | None = None, compute_slowdown: float = 1.0,
                        hetero: Heterogeneity | None = None, jitter_slowdown: float | None = None,
                        layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ClusterSpecs the predictions run on: "base" for every strategy, and "jitter" (with a
    `--jitter` configuration) for the simulators that read the bench's jitter emulation, its
    speeds from the unpadded compute (`caramel.bench.hetero_prediction`; none when a pause is at
    least the measured compute). Each takes the contention factor measured on its own compute:
    `compute_slowdown` on the padded medians for "base", `jitter_slowdown` on the unpadded ones
    for "jitter" (None: `compute_slowdown`; `contention_factors`). Where the two differ, "base"
    also carries `jitter_slowdown` - 1 as a transfer's CPU share (`bench_cluster`): a sleep is
    neither slowed nor a load, so the padded factor understates what a transfer takes of a
    shared host's CPU (the pipeline's sharing model, its only reader). `layout`: `bench_cluster`'s."""
    hetero = (hetero or Heterogeneity()).check(world)
    uneven: dict[str, Any] = {}
    rates = hetero.worker_bandwidth_bps(world, bandwidth_bps)
    if rates:
        uneven["worker_bandwidth_bps"] = rates
    speeds = worker_speeds(profile.step_time_s, rank_compute_s) if rank_compute_s else None
    cpu_share = None if jitter_slowdown in (None, compute_slowdown) else max(0.0, jitter_slowdown - 1.0)
    out = {"base": bench_cluster(world, bandwidth_bps, speeds, link, compute_slowdown, uneven, sharing_of(profile),
                                 cpu_share, layout)}
    if hetero.jitter:
        unpadded, problem = hetero.unpadded_compute_s_of(rank_compute_s) if rank_compute_s else (None, None)
        if problem is None:  # else no jitter cluster: its readers run on "base", marked (`predict_strategies`)
            out["jitter"] = bench_cluster(world, bandwidth_bps,
                                          worker_speeds(profile.step_time_s, unpadded) if unpadded else None, link,
                                          compute_slowdown if jitter_slowdown is None else jitter_slowdown,
                                          {**uneven, "compute_jitter": hetero.compute_jitter()},
                                          sharing_of(profile))
    return out


def predict_strategies(profile: Any | None, names: list[str], world: int, bandwidth_bps: float | None,
                       rank_compute_s: list[float] | None = None, link: dict[str, Any] | None = None,
                       compute_slowdown: float = 1.0, hetero: Heterogeneity | None = None,
                       jitter_slowdown: float | None = None, layout: dict[str, Any] | None = None
                       ) -> dict[str, dict[str, Any]]:
    """Per strategy name: {"step_time_s", "exact", "error", "cluster", "ignores"}; {} without a
    profile or a rate (one worker, no communication). `rank_compute_s`: each rank's compute-only
    median (`worker_speeds`); None replays the profile as measured. `link`, `compute_slowdown`:
    the probe's fixed costs and the measured contention (`bench_cluster`; `jitter_slowdown`: the
    "jitter" cluster's, `prediction_clusters`). `hetero`: the
    configuration's uneven workers (`prediction_clusters`); "cluster" names the one a strategy
    ran on, "ignores" the inputs its simulator does not take. A failure is the strategy's
    `error`, never the bench's."""
    if profile is None or bandwidth_bps is None or world < 2:
        return {}
    from caramel.strategies.recommend import predict

    hetero = hetero or Heterogeneity()
    clusters = prediction_clusters(profile, world, bandwidth_bps, rank_compute_s, link, compute_slowdown, hetero,
                                   jitter_slowdown, layout)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        which = "jitter" if hetero.reads_jitter(name) and "jitter" in clusters else "base"
        ignores = hetero.ignored_by(name) + (["jitter"] if hetero.reads_jitter(name) and which == "base" else [])
        marks = {"cluster": which, **({"ignores": ignores} if ignores else {})}
        if hetero.reads_jitter(name) and which == "base":
            marks["note"] = hetero.unpadded_compute_s_of(rank_compute_s)[1] if rank_compute_s else "no compute medians"
        try:
            (p,) = predict(profile, clusters[which], [name])
            out[name] = {"step_time_s": p.step_time_s, "exact": p.exact, "error": p.error,
                         **({"plan": p.plan} if p.plan else {}), **marks}
            if p.plan and "sharing_unsettled_passes" in p.plan:
                print(f"[bench] warning: the prediction for {name} did not settle its host-sharing factors "
                      f"({p.plan['sharing_unsettled_passes']} passes, a cycle; the slowest pass is kept)", file=sys.stderr)
        except Exception as e:  # a prediction is an extra: it must never fail the bench
            print(f"[bench] no prediction for {name}: {type(e).__name__}: {e}", file=sys.stderr)
            out[name] = {"step_time_s": None, "exact": False, "error": f"{type(e).__name__}: {e}", **marks}
    return out


def job_predictions(profile: Any | None, names: list[str], world: int, grad_bytes: int, comm_s: float,
                    comm_buckets: int, rank_compute_s: list[float], spans: list[Any], probed: dict[str, Any] | None,
                    traffic: dict[str, Any] | None = None, hetero: Heterogeneity | None = None,
                    layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything a job's raw results say about the models: each strategy's prediction with the
    probed fixed costs (`probed`, `probe_link`'s measurements) and the measured contention (the
    concurrent baseline's `spans` per rank) and how the links carry a parameter server's traffic
    (`traffic`, `caramel.bench.traffic_probe`'s), the same from the achieved link rate alone, the fit and the contention
    factor; `hetero`: the configuration's uneven workers, and under "prediction_inputs" what a
    replay needs (the profile, each rank's compute median, the heterogeneity, the clusters the
    predictions ran on, and those of the rate-only ones); `layout`: several ranks per host
    (`bench_cluster`). Inputs are the baselines, the probes and the profile: never a strategy's own steps."""
    from caramel.bench.lower_bound import effective_bandwidth_bps  # the zoo's imports, only when a job runs

    # on the padded compute and spans, as the "base" cluster's speeds are (`prediction_clusters`)
    link, slowdown, net_bps = measured_link(grad_bytes, world, comm_s, comm_buckets, rank_compute_s, spans, probed)
    jitter_slowdown = contention_factors(rank_compute_s, spans, link, hetero)[1]
    if traffic is not None:  # the ps model's inputs (`bench_cluster`)
        link = {**(link or {}), "traffic_probe": traffic, "link_queue_s": traffic.get("queue_s"),
                "push_efficiency": efficiency(traffic, "all_to_all", world, net_bps),
                "pull_efficiency": efficiency(traffic, "broadcasts", world, net_bps),
                "push_efficiency_by_count": efficiency_by_count(traffic, world, net_bps),
                "pull_efficiency_by_count": pull_efficiency_by_count(traffic, world, net_bps),
                # the probe runs on gloo only, where this runtime's flat colocated servers post
                # their push receives at the step's first gradient (`PsEngine.posts_receives_early`)
                "push_receives_early": True}
    rate_only_bps = effective_bandwidth_bps(grad_bytes, world, comm_s)
    modelled = profile is not None and world > 1
    clusters = (prediction_clusters(profile, world, net_bps, rank_compute_s, link, slowdown, hetero, jitter_slowdown,
                                    layout) if modelled and net_bps is not None else {})
    rate_only = (prediction_clusters(profile, world, rate_only_bps, rank_compute_s, hetero=hetero, layout=layout)
                 if modelled and rate_only_bps is not None else {})
    return {"predicted": predict_strategies(profile, names, world, net_bps, rank_compute_s, link, slowdown, hetero,
                                            jitter_slowdown, layout),
            "compute_slowdown": slowdown,
            "predicted_rate_only": predict_strategies(profile, names, world, rate_only_bps, rank_compute_s,
                                                      hetero=hetero, layout=layout),
            "link_fit": link,
            "prediction_inputs": {"profile": profile.to_dict() if profile is not None else None,
                                  "rank_compute_s": list(rank_compute_s),
                                  **record_heterogeneity(hetero),
                                  "compute_slowdowns": {"base": slowdown, "jitter": jitter_slowdown},
                                  "clusters": {k: c.to_dict() for k, c in clusters.items()},
                                  "clusters_rate_only": {k: c.to_dict() for k, c in rate_only.items()}}}


def measured_link(grad_bytes: int, world: int, comm_s: float, comm_buckets: int, rank_compute_s: list[float],
                  spans: list[Any], probed: dict[str, Any] | None) -> tuple[dict[str, Any] | None, float, float | None]:
    """From a job's baselines and probe: the link's fixed costs (`link_costs`, with the net rate
    added), the compute slowdown beside collectives and the net link rate: what
    `job_predictions` and the pipeline runtime's cluster (`caramel.bench.pipeline_plan`) build
    their ClusterSpec from."""
    link = link_costs(probed)
    # the probe's pause per collective is charged apart, as the event engine charges it
    slowdown = job_slowdown(rank_compute_s, spans, (link or {}).get("collective_cpu_s") or 0.0)
    # with the probed fixed costs charged per collective, the rate they are netted out of
    net_bps = net_bandwidth_bps(grad_bytes, world, comm_s, comm_buckets, link)
    if link is not None:
        link["net_bandwidth_bps"] = net_bps
    return link, slowdown, net_bps


def record_heterogeneity(hetero: Heterogeneity | None) -> dict[str, Any]:
    """The heterogeneity as the records carry it: without the per-step `concurrent_pauses`
    (4 x 42 triples per job, copied into every record), which pair with spans the records do
    not hold; the trace directory's prediction_inputs.json keeps both. Instead, per rank, the
    median [slept_s, slept_in_overlap_s, collectives_started] ("concurrent_padding_median")."""
    d = (hetero or Heterogeneity()).to_dict()
    pauses = d.pop("concurrent_pauses", None)
    if not pauses:
        return {"heterogeneity": d}
    return {"heterogeneity": d,
            "concurrent_padding_median": [[median([p[i] for p in r]) if r else None for i in range(3)] for r in pauses]}


def contention_factors(rank_compute_s: list[float], spans: list[Any], link: dict[str, Any] | None,
                       hetero: Heterogeneity | None) -> tuple[float, float]:
    """The contention factor on the padded compute-only medians and concurrent spans (the
    "base" cluster's, whose speeds come from those medians) and on the same less the
    `--jitter` sleeps' padding (the "jitter" cluster's, speeds from the unpadded medians;
    `caramel.bench.contention`). A sleep is not slowed by transfers, so each cluster's speeds
    and factor must be measured on the same compute. Without recorded paddings both are equal."""
    cpu_s = (link or {}).get("collective_cpu_s") or 0.0
    padded = job_slowdown(rank_compute_s, spans, cpu_s)
    alone_s, unpadded = (hetero or Heterogeneity()).contention_inputs(rank_compute_s, spans)
    if alone_s is rank_compute_s and unpadded is spans:
        return padded, padded
    return padded, job_slowdown(alone_s, unpadded, cpu_s)


def probe_link(grad_bytes: int, device: Any, backend: str, world: int, points: int = PROBE_POINTS
               ) -> dict[str, Any] | None:
    """Every rank, at the same point: all-reduces from 4 KB up to the model's gradient bytes
    (geometric), timed by `caramel.topology.probe.measure_in_job`; the measurements, or None
    with one worker or where a rank could not hold the probe's tensors (a prediction is an
    extra: it never fails the bench). The ranks agree on that before the first collective, so
    a rank that cannot probe never leaves the others waiting in one."""
    if world < 2:
        return None
    import torch
    import torch.distributed as dist

    from caramel.topology.probe import MIN_BYTES, measure_in_job

    top = max(int(grad_bytes), 2 * MIN_BYTES)
    sizes = sorted({int(MIN_BYTES * (top / MIN_BYTES) ** (k / (points - 1))) // 4 * 4 for k in range(points)})
    try:
        torch.empty(max(sizes) // 4, dtype=torch.float32, device=device)
        ok = torch.ones(1, device=device)
    except Exception as e:
        print(f"[bench] no link probe on this rank: {type(e).__name__}: {e}", file=sys.stderr)
        ok = torch.zeros(1, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() < 1:
        return None
    return measure_in_job(sizes, PROBE_REPS, 2, device, backend)


def link_costs(measured: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fixed costs per collective (`LINK_FIELDS`) fitted to `probe_link`'s measurements, with
    the fit's own rate and error for the record; None without measurements or a fit."""
    if measured is None:
        return None
    from caramel.topology.probe import spec_from_measured

    try:
        spec, fit = spec_from_measured(measured, {"source": "bench link probe"}, PROBE_REPS)
    except Exception as e:
        print(f"[bench] no link fit: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return {"latency_s": spec.latency_s, "queued_latency_s": spec.queued_latency_s,
            "collective_cpu_s": spec.collective_cpu_s, "fit_bandwidth_bps": fit.bandwidth_bps,
            "fit_max_rel_error": fit.max_rel_error, "probe": spec.meta.get("probe")}


def net_bandwidth_bps(grad_bytes: int, world: int, comm_s: float, buckets: int,
                      link: dict[str, Any] | None) -> float | None:
    """The link rate the comm-only baseline achieved once its collectives' fixed costs are taken
    out: `buckets` ring all-reduces issued back to back pay 2(n-1) latencies for the first and
    2(n-1) queued latencies for each other (`caramel.topology.spec`), so a prediction that
    charges those costs again per collective does not count them twice. Without `link`, or
    when the fixed costs would take half the time or more (the fit does not describe these
    transfers), the rate with them in (`effective_bandwidth_bps`)."""
    from caramel.bench.lower_bound import effective_bandwidth_bps

    gross = effective_bandwidth_bps(grad_bytes, world, comm_s)
    if gross is None or not link or link.get("latency_s") is None:
        return gross
    queued = link["queued_latency_s"] if link.get("queued_latency_s") is not None else link["latency_s"]
    fixed_s = 2 * (world - 1) * (link["latency_s"] + max(buckets - 1, 0) * min(queued, link["latency_s"]))
    if fixed_s >= 0.5 * comm_s:
        return gross
    return effective_bandwidth_bps(grad_bytes, world, comm_s - fixed_s)


def prediction_error(predicted_s: float | None, measured_s: float | None) -> float | None:
    """predicted / measured - 1 (positive: the simulator expected a slower step)."""
    if predicted_s is None or not measured_s:
        return None
    return predicted_s / measured_s - 1.0


@dataclass(frozen=True)
class RecommendationCheck:
    """One configuration: the simulator's pick among the exact strategies measured there,
    against the measured fastest of the same set."""

    configuration: str
    recommended: str
    fastest: str
    recommended_step_s: float
    fastest_step_s: float

    @property
    def slowdown(self) -> float:
        """How much slower the recommendation ran than the fastest (0: it was the fastest)."""
        return self.recommended_step_s / self.fastest_step_s - 1.0

    @property
    def hit(self) -> bool:
        return self.slowdown <= RECOMMENDATION_TOLERANCE


def check_recommendation(configuration: str, rows: list[tuple[str, float | None, float | None, bool]]
                         ) -> RecommendationCheck | None:
    """`rows`: (strategy, measured median, predicted step, exact) of one configuration. None
    when fewer than two exact strategies were both measured and predicted."""
    pool = [(n, m, p) for n, m, p, exact in rows if exact and m is not None and p is not None]
    if len(pool) < 2:
        return None
    rec = min(pool, key=lambda r: r[2])
    fast = min(pool, key=lambda r: r[1])
    return RecommendationCheck(configuration, rec[0], fast[0], rec[1], fast[1])


def accuracy_by_kind(errors: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """Per strategy kind: the median and largest |error| and the share of rows within
    ACCURACY_TARGET, over (kind, error) pairs."""
    out: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(k for k, _ in errors):
        errs = [abs(e) for k, e in errors if k == kind]
        out[kind] = {"rows": len(errs), "median_abs_error": median(errs), "max_abs_error": max(errs),
                     "within_target": sum(e <= ACCURACY_TARGET for e in errs) / len(errs)}
    return out


def recommendation_checks(records: list[Any], label) -> list[RecommendationCheck]:
    """`check_recommendation` per configuration of bench records (`label(record)` names the
    configuration), in the order first seen; a prediction whose simulator ignores an input of
    the configuration (`prediction_ignores`) is left out of the pool, as out of the accuracy."""
    out = []
    for conf in dict.fromkeys(label(r) for r in records):
        rows = [(r.strategy, r.step_s, r.predicted_step_s, bool(r.prediction_exact))
                for r in records if label(r) == conf and not getattr(r, "prediction_ignores", None)]
        check = check_recommendation(conf, rows)
        if check is not None:
            out.append(check)
    return out


def records_accuracy(records: list[Any], predicted: str = "predicted_step_s") -> dict[str, dict[str, float]]:
    """`accuracy_by_kind` over bench records that have both a measured median and the prediction
    in their field `predicted` (`predicted_rate_only_s`: the one without the probed fixed costs),
    and whose simulator took every input of the configuration (no `prediction_ignores`)."""
    errors = [(r.kind, prediction_error(getattr(r, predicted), r.step_s)) for r in records
              if not getattr(r, "prediction_ignores", None)]
    return accuracy_by_kind([(kind, e) for kind, e in errors if e is not None])
