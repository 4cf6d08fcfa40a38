"""The cluster and profile a bench hands a pipeline's runtime, so that it cuts as the prediction does.

A pipeline picks its cut (`partition="auto"`), its microbatch count and, with
`replicas="auto"`, its replica counts at its first step. Given nothing, the runtime profiles
one microbatch on its first rank alone and plans for 1 Gbit/s links and equal workers, while the
bench predicts it from the job's profile at the link rate and worker speeds the job measured:
on 3-worker ResNet-18 points the two cut differently (docs/pipeline.md). So, in a job with a
pipeline, before any strategy is built: the workload is profiled and the links probed (both
reused by the predictions), the three baselines run as in the rounds (all ranks at once, the
order rotating, as many rounds), and the ClusterSpec is derived by the predictions' own functions
(`measured_link`, `worker_speeds`, `bench_cluster`). Every pipeline plans from that profile
and that spec (`caramel.pipeline(..., cluster=, profile=)`). The predictions still take the
rounds' baselines; where the two cuts still differ the bench warns (`cut_mismatch`).
"""
from __future__ import annotations

import sys
from typing import Any

import torch.distributed as dist

from caramel.bench.blocks import measure_block
from caramel.stats import median


def measure_plan_cluster(runners: dict[str, Any], steps: int, rounds: int, warmup_steps: int, profile: Any,
                         world: int, grad_bytes: int, probed: dict[str, Any] | None) -> Any:
    """The ClusterSpec the predictions would build from the three baselines measured as the
    rounds measure them (`rounds` rounds of one block of `steps` each, the order rotating; every
    rank calls it; the spec is rank 0's, broadcast, so every rank plans alike). One block each
    was too few: a rank's compute step in the job's first block can be far from its pace later
    (speeds 1.44, 2.41, 2.39 against 2.03, 1.70, 1.73 in the rounds of one run)."""
    from caramel.bench.blocks import round_order
    from caramel.bench.report import job_step_times

    names = ["compute", "comm", "concurrent"]
    mine: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        for _ in range(warmup_steps):
            runners[name].step()
        runners[name].start_measuring()
    for r in range(rounds):
        for name in round_order(names, r):
            dist.barrier()
            mine[name] += measure_block(runners[name], steps)
    spans = list(runners["concurrent"].spans)
    # --jitter: each compute-only step's sleep and each concurrent step's padding, as the rounds record them
    jittered = runners["compute"].jitter is not None
    pauses = (list(runners["compute"].paused_s), list(runners["concurrent"].padding)) if jittered else None
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (mine, spans, pauses))
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        rank_compute = [median(g["compute"]) for g, _, _ in gathered]
        comm_s = median(job_step_times([g["comm"] for g, _, _ in gathered], steps))
        buckets = runners["comm"].stats().get("buckets", 1)
        box[0] = plan_cluster(profile, world, grad_bytes, comm_s, buckets, rank_compute, [s for _, s, _ in gathered],
                              probed, padding_of([g["compute"] for g, _, _ in gathered], [p for _, _, p in gathered],
                                                 steps))
    dist.broadcast_object_list(box, src=0)
    return box[0]


def padding_of(compute_step_times_s: list[list[float]], pauses: list[Any], steps_per_round: int) -> Any:
    """Under `--jitter` (every rank's `pauses` recorded: its compute-only steps' sleeps and its
    concurrent steps' paddings), the `Heterogeneity` that carries them to the contention factor
    (`caramel.bench.hetero_prediction.job_heterogeneity`'s fields); None without."""
    if not pauses or any(p is None for p in pauses):
        return None
    from caramel.bench.hetero_prediction import Heterogeneity, unpadded_median_s

    return Heterogeneity(unpadded_compute_s=[unpadded_median_s(t, paused, steps_per_round)
                                             for t, (paused, _) in zip(compute_step_times_s, pauses)],
                         concurrent_pauses=[[list(p) for p in padding] for _, padding in pauses])


def plan_cluster(profile: Any, world: int, grad_bytes: int, comm_s: float, comm_buckets: int,
                 rank_compute_s: list[float], spans: list[Any], probed: dict[str, Any] | None,
                 padding: Any = None) -> Any:
    """The spec a pipeline plans at, from rank 0's gathered baselines: the predictions' "base"
    cluster (`caramel.bench.prediction.prediction_clusters`), which the pipeline prediction runs
    on: speeds from the measured (under `--jitter`, padded) compute-only medians and the
    contention factor on the same, padded, spans (`contention_factors`), so that the runtime
    cuts at the factor its prediction takes; under `--jitter` (`padding`: `padding_of`'s) a
    transfer's CPU share from the factor on the same spans less their padding, as the
    prediction's (`transfer_cpu_share`). None without a net link rate."""
    from caramel.bench.prediction import contention_factors, measured_link, prediction_clusters

    link, slowdown, net_bps = measured_link(grad_bytes, world, comm_s, comm_buckets, rank_compute_s, spans, probed)
    if not net_bps:
        return None
    jitter_slowdown = contention_factors(rank_compute_s, spans, link, padding)[1]
    return prediction_clusters(profile, world, net_bps, rank_compute_s, link, slowdown,
                               jitter_slowdown=jitter_slowdown)["base"]


def runtime_cluster(profile: Any, cluster: Any, options: Any, group: Any = None) -> Any:
    """The spec one pipeline's runtime plans at: `cluster` itself, or, where its workers share
    a host's cores and only the cut is the runtime's to choose (`partition="auto"`), its speeds
    scaled by the factor the prediction of this pipeline settles at (one per worker under the
    spec's `sharing_model="stage"`)
    (`caramel.strategies.pipeline.sharing`), so that the cut, which takes the speeds as given,
    is the prediction's. With `replicas="auto"` or `microbatches="auto"` the spec as given:
    those choosers settle each candidate's speeds themselves, as the prediction's do (the cut
    comes with their choice). Computed on rank 0 (whose profile the predictions and the plans
    take) and broadcast; every rank calls it. `group`: the pipeline's process group (None: the
    world), whose first rank computes it."""
    from caramel.strategies.pipeline.sharing import scaled, shares_cores
    from caramel.strategies.pipeline.simulate import simulate_pipeline

    if cluster is None or profile is None or not shares_cores(cluster):
        return cluster
    if options is not None and (options.auto_replicas or options.microbatches == "auto"):
        return cluster
    box: list[Any] = [None]
    src = 0 if group is None else dist.get_global_rank(group, 0)
    if dist.get_rank() == src:
        try:
            box[0] = simulate_pipeline(profile, cluster, options).meta["sharing"]["factor"]
        except Exception as e:  # the runtime plans (and reports) its own error
            print(f"[bench] no host-sharing factor for a pipeline's plan: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
    dist.broadcast_object_list(box, src=src, group=group)
    # without a factor, the spec as given: its speeds, and its compute_slowdown beside a lane's transfers
    return cluster if box[0] is None else scaled(cluster, box[0])


def cluster_summary(cluster: Any) -> dict[str, Any] | None:
    """What a pipeline's record keeps of the spec it planned at."""
    if cluster is None:
        return None
    return {"bandwidth_bps": cluster.bandwidth_bps, "latency_s": cluster.latency_s,
            "speeds": [w.speed for w in cluster.workers], "compute_slowdown": cluster.compute_slowdown,
            "alone_speedup": cluster.alone_speedup, "ranks_per_host": cluster.ranks_per_host,
            "sharing_model": cluster.sharing_model, "reduce_cpu": cluster.reduce_cpu,
            "reduce_buckets": cluster.reduce_buckets}


def cut_mismatches(stats: dict[str, dict[str, Any]], predicted: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Per pipeline strategy whose runtime cut (or counts, or microbatches) differs from its
    prediction's: what differs. Printed by the bench, kept in the raw results."""
    out = {}
    for name, st in stats.items():
        plan = (predicted.get(name) or {}).get("plan")
        if not plan or "boundaries" not in st:
            continue
        ran = {"boundaries": [str(b) for b in st.get("boundaries") or []], "microbatches": st.get("microbatches"),
               "replicas": st.get("replicas")}
        model = {"boundaries": [str(b) for b in plan.get("boundaries") or []],
                 "microbatches": plan.get("microbatches"), "replicas": plan.get("replicas")}
        diff = [f"{k}: ran {ran[k]}, predicted {model[k]}" for k in ran
                if model[k] is not None and ran[k] is not None and ran[k] != model[k]]
        if diff:
            out[name] = "; ".join(diff)
            print(f"[bench] warning: {name}: the runtime's plan differs from the prediction's ({out[name]})",
                  file=sys.stderr, flush=True)
    return out
