"""A heterogeneous bench file's predictions replayed with this tree's cluster inputs.

The file's meta `prediction_inputs` keeps the profile, each rank's compute-only median, the
heterogeneity and the clusters the predictions ran on. This rebuilds the clusters from the
same measurements with this tree's `caramel.bench.prediction.prediction_clusters` (speeds,
per-worker rates, the jitter's pause), keeping the recorded link costs, rate and contention,
and prints each strategy's recorded and replayed prediction against the measured median: what
a change to how the bench derives those inputs does to a run already measured.

    PYTHONPATH=. python experiments/replay_hetero_inputs.py docs/results/bench-hetero-pred-jitter.json
"""
from __future__ import annotations

import argparse

from caramel.bench.hetero_prediction import Heterogeneity
from caramel.bench.prediction import prediction_clusters
from caramel.bench.report import config_label, read_records
from caramel.profile.model_profile import ModelProfile
from caramel.strategies.reads import strategy_kind
from caramel.strategies import STRATEGIES
from caramel.strategies.recommend import predict
from caramel.topology.spec import ClusterSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json")
    args = ap.parse_args()
    results = read_records(args.bench_json)
    for label, inputs in results.meta.get("prediction_inputs", {}).items():
        profile = ModelProfile.from_dict(inputs["profile"])
        hetero = Heterogeneity.from_dict(inputs["heterogeneity"])
        recorded = {k: ClusterSpec.from_dict(c) for k, c in inputs["clusters"].items()}
        base = recorded["base"]
        link = {"latency_s": base.latency_s, "queued_latency_s": base.queued_latency_s,
                "collective_cpu_s": base.collective_cpu_s, **{k: v for k, v in base.meta.items()
                                                               if k in ("link_queue_s", "push_efficiency", "pull_efficiency")}}
        world = len(inputs["rank_compute_s"])
        clusters = prediction_clusters(profile, world, base.bandwidth_bps, inputs["rank_compute_s"], link,
                                       base.compute_slowdown, hetero)
        print(f"{label}:")
        for name, cluster in clusters.items():
            print(f"  {name} cluster speeds {[round(w.speed, 3) for w in cluster.workers]} (recorded "
                  f"{[round(w.speed, 3) for w in recorded[name].workers] if name in recorded else None})")
        # a /2 file's records do not carry the heterogeneity their label would name: match by workers
        for r in (r for r in results.records if r.workers == world and r.step_time_median_s):
            which = r.prediction_cluster or ("jitter" if hetero.reads_jitter(r.strategy) else "base")
            cluster = clusters.get(which, clusters["base"])
            (p,) = predict(profile, cluster, [r.strategy])
            m = r.step_time_median_s
            # the all-reduce models under the jitter's pauses: their per-step median beside the mean (`caramel.sim.jitter`)
            meta = STRATEGIES.spec(r.strategy).simulate(profile, cluster).meta if which == "jitter" else {}
            median_s = meta.get("job_step_median_s") if strategy_kind(r.strategy) != "gossip" else None
            print(f"  {r.strategy} ({config_label(r)}) on {which}: measured {1e3 * m:.1f} ms, recorded prediction "
                  f"{1e3 * r.predicted_step_s:.1f} ({r.predicted_step_s / m - 1:+.1%}), replayed "
                  f"{1e3 * p.step_time_s:.1f} ({p.step_time_s / m - 1:+.1%})"
                  + (f", per-step median {1e3 * median_s:.1f} ({median_s / m - 1:+.1%})" if median_s else ""))


if __name__ == "__main__":
    main()
