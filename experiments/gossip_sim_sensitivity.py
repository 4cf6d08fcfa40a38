"""How far each candidate for what the gossip simulator leaves out moves its predictions, on a
bench run's saved inputs (meta `prediction_inputs`: the profile and the clusters the bench
predicted on, its measured rates, probe, contention, jitter and slow link).

Each gossip row is predicted with this tree's `simulate_gossip` as the bench did ("recorded"),
then with one input changed at a time, each a hypothesis for the residual, never a fit:

- "cpu_all": the compute slowed by `compute_slowdown` through the whole step, not only while the
  worker's own exchange is on the wire (the host's 2 cores carry every worker's transfers);
- "rate_0.8": every link at 0.8 of the measured net rate (how much a slower wire would move it);
- "msg_queue" / "msg_cpu": a fixed cost per message (the probe's `link_queue_s` or the
  collective CPU `collective_cpu_s`) added to each exchange, for `bucket_cap_mb`'s messages;
- "bench_stat": the bench's statistic on the simulated per-rank step times (the job clock
  restarted every `--steps` steps, the median of the job steps) over 80 steps.

    PYTHONPATH=. python -m experiments.gossip_sim_sensitivity docs/results/gossip-bench-jitter-4.json ...
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json", nargs="+")
    args = ap.parse_args()
    from caramel.bench.step_metrics import job_step_times
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies import STRATEGIES
    from caramel.strategies.gossip.simulate import message_needs, simulate_gossip
    from caramel.topology.spec import ClusterSpec

    for path in args.bench_json:
        data = json.loads(Path(path).read_text())
        per_round = data["meta"]["settings"]["steps_per_round"]
        for inputs in data["meta"]["prediction_inputs"].values():
            profile = ModelProfile.from_dict(inputs["profile"])
            print(Path(path).name)
            for r in data["records"]:
                spec = STRATEGIES.spec(r["strategy"])
                if spec.info.name != "gossip" or r.get("step_time_median_s") is None:
                    continue
                options, measured_s = spec.options, r["step_time_median_s"]
                cluster = ClusterSpec.from_dict(inputs["clusters"][r["prediction_cluster"]])
                need, _ = message_needs(profile.trainable(), len(profile.modules), 1, options.bucket_cap_mb * 2 ** 20)
                messages = len(set(need))

                def err(c, stat=False):
                    res = simulate_gossip(profile, c, options, iterations=80 if stat else 4)
                    if not stat:
                        return res.step_time_s / measured_s - 1
                    ranks = [[0.0] * 80 for _ in range(c.world_size)]
                    for e in res.trace.events:
                        ranks[e.rank][e.iteration] = e.duration_s
                    return statistics.median(job_step_times([t[8:] for t in ranks], per_round)) / measured_s - 1

                slowed = [dataclasses.replace(w, speed=w.speed / cluster.compute_slowdown) for w in cluster.workers]
                # latency_s is paid twice per exchange (the receiver's notice, the landing)
                per_msg = lambda cost_s: dataclasses.replace(cluster, latency_s=cluster.latency_s + cost_s * messages / 2)
                rows = {"recorded": err(cluster),
                        "cpu_all": err(dataclasses.replace(cluster, compute_slowdown=1.0, workers=slowed)),
                        "rate_0.8": err(dataclasses.replace(cluster, bandwidth_bps=0.8 * cluster.bandwidth_bps, meta={
                            **cluster.meta, **({"worker_bandwidth_bps": [0.8 * b for b in cluster.meta["worker_bandwidth_bps"]]}
                                               if "worker_bandwidth_bps" in cluster.meta else {})})),
                        "msg_queue": err(per_msg(cluster.meta.get("link_queue_s", 0.0))),
                        "msg_cpu": err(per_msg(cluster.collective_cpu_s)),
                        "bench_stat": err(cluster, stat=True)}
                print(f"  {r['strategy'][:64]:64s} {1e3 * measured_s:6.1f} ms, {messages} msg  "
                      + "  ".join(f"{k} {100 * v:+5.1f}%" for k, v in rows.items()), flush=True)


if __name__ == "__main__":
    main()
