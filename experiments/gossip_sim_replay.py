"""The gossip simulator against recorded bench runs, before and after a model change.

A bench record keeps every prediction input but the profile (`experiments/predict_again.py`):
the comm-only baseline's net link rate, the probe's fixed costs and traffic efficiencies, the
compute slowdown beside transfers and the configuration's heterogeneity. This profiles the
configuration's model here, replays it at the pace each record's compute-only step shows, and
predicts every gossip row three ways: the model of `--ref` on the cluster the bench built (no
slow link, no jitter: what the bench printed), the same model on the cluster the configuration
ran (`--slow-link`: the slow worker's rate; `--jitter`: the seeded draws), and this tree's model
on that cluster, the jitter as the bench emulates it. Each against the measured median; the
strategies' own steps are never inputs. `--ref` must name a fixed commit (114d323: the model
before gloo's rendezvous, the flow share and the pause), not a branch that moves.

    python -m experiments.gossip_sim_replay docs/results/gossip-bench-jitter-2.json ... --ref 114d323 \\
        --profile resnet18=docs/results/gossip-sim-profile.json --json docs/results/gossip-sim-replay.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import torch

from caramel.bench.hetero import link_rates_bps
from caramel.jsonio import write_json
from experiments.predict_again import old_simulator


def heterogeneous(cluster, meta: dict, workers: int, net_bps: float, pause: bool = False):
    """`cluster` with the configuration's slow link and jitter in its meta. The comm-only ring
    all-reduce runs at the slowest link's pace, so with `--slow-link R:F` the measured net rate
    is the slow link's and the others' is F times it. `pause`: the jitter as the bench emulates
    it (a sleep after the forward, `caramel.strategies.gossip.links`)."""
    uneven = next(iter((meta.get("heterogeneity") or {}).values()), None) or {}
    extra = {}
    if uneven.get("slow_link"):
        rank, factor = uneven["slow_link"]
        extra["worker_bandwidth_bps"] = link_rates_bps(net_bps * factor, workers, [rank, factor])
    if uneven.get("jitter"):
        rank, fraction, seed = uneven["jitter"]
        extra["compute_jitter"] = {"rank": rank, "fraction": fraction, "seed": seed,
                                   **({"pause_after_forward": True} if pause else {})}
    return dataclasses.replace(cluster, meta={**cluster.meta, **extra}), uneven


def new_model_slowdown(record: dict) -> float:
    """The compute slowdown beside transfers that this tree's model is given for `record`: the
    factor on the unpadded compute where the bench recorded it apart
    (`prediction_inputs.compute_slowdowns.jitter`; gossip-bench-jitter-6.json predates that and
    holds it as `compute_slowdown`), else the record's `compute_slowdown`, else 1."""
    jitter = ((record.get("prediction_inputs") or {}).get("compute_slowdowns") or {}).get("jitter")
    return jitter or record.get("compute_slowdown") or 1.0


def pct(error: float | None) -> str:
    return "   -" if error is None else f"{100 * error:+4.0f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json", nargs="+")
    ap.add_argument("--ref", required=True,
                    help="git commit hash whose gossip simulate.py is the 'before' model (a branch moves: refused)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", default=None,
                    help="MODEL=PATH: a saved profile to replay for the records of bench model MODEL "
                         "(else one taken here)")
    args = ap.parse_args()
    if not re.fullmatch(r"[0-9a-f]{7,40}", args.ref):
        ap.error(f"--ref must be a commit hash (7 to 40 hex digits) so the replay stays reproducible, got {args.ref!r}")
    torch.set_num_threads(1)
    from caramel.bench.harness import make_workload
    from caramel.bench.lower_bound import effective_bandwidth_bps, profile_workload
    from caramel.bench.matrix import BenchConfig
    from caramel.bench.prediction import bench_cluster, prediction_error, worker_speeds
    from caramel.strategies import STRATEGIES
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.gossip.simulate import simulate_gossip

    before = old_simulator(args.ref, "gossip")
    profiles: dict = {}
    rows = []
    for path in args.bench_json:
        data = json.loads(Path(path).read_text())
        for r in data["records"]:
            spec = STRATEGIES.spec(r["strategy"])
            if spec.info.name != "gossip" or r.get("step_time_median_s") is None:
                continue
            key = (r["model"], json.dumps(r.get("model_options") or {}, sort_keys=True), r["batch_size"])
            saved_for, _, saved = (args.profile or "").partition("=")
            if key not in profiles and saved and saved_for == r["model"]:
                profiles[key] = ModelProfile.load(saved)
                if profiles[key].batch_size != r["batch_size"]:
                    raise SystemExit(f"--profile {args.profile}: batch {profiles[key].batch_size}, "
                                     f"the records' {r['batch_size']}")
            if key not in profiles:
                cfg = BenchConfig(model=r["model"], workers=r["workers"],
                                  model_options=dict(r.get("model_options") or {}), batch_size=r["batch_size"])
                profiles[key] = profile_workload(make_workload(cfg, 0, torch.device("cpu")))
            profile = profiles[key]
            link = r.get("link_fit") or {}
            net_bps = link.get("net_bandwidth_bps")
            if net_bps is None:  # no probe fit recorded: the rate with the fixed costs in
                net_bps = effective_bandwidth_bps(r["grad_bytes"], r["workers"], r["comm_s"])
            speeds = worker_speeds(profile.step_time_s, [r["compute_s"]] * r["workers"])
            slowdown = r.get("compute_slowdown") or 1.0
            bench = bench_cluster(r["workers"], net_bps, speeds, link or None, slowdown)
            ran, uneven = heterogeneous(bench, data["meta"], r["workers"], net_bps)
            # this tree's model takes the bench's jitter as it is emulated: compute at the pace
            # the padded compute-only step shows without its padding (nominal = 1 / (1 - f)),
            # the pause after the forward on top
            nominal = 1.0 / (1.0 - uneven["jitter"][1]) if uneven.get("jitter") else 1.0
            unpadded_speeds = worker_speeds(profile.step_time_s, [r["compute_s"] / nominal] * r["workers"])
            new_slowdown = new_model_slowdown(r)
            unpadded = bench_cluster(r["workers"], net_bps, unpadded_speeds, link or None, new_slowdown)
            ran_new, _ = heterogeneous(unpadded, data["meta"], r["workers"], net_bps, pause=True)
            measured_s = r["step_time_median_s"]
            old_bench = before(profile, bench, spec.options)
            old_ran = before(profile, ran, spec.options)
            new = simulate_gossip(profile, ran_new, spec.options)
            row = {"file": Path(path).name, "strategy": r["strategy"], "workers": r["workers"],
                   "bandwidth": r["bandwidth"], "uneven": uneven or None, "measured_s": measured_s,
                   "bench_predicted_s": r.get("predicted_step_s"), "old_bench_cluster_s": old_bench.step_time_s,
                   "old_s": old_ran.step_time_s, "new_s": new.step_time_s,
                   "new_job_median_s": new.meta.get("job_step_median_s"),
                   # compute_slowdown: the factor the new model used; the record's own beside it
                   "inputs": {"net_bandwidth_bps": net_bps, "compute_slowdown": new_slowdown,
                              "compute_slowdown_recorded": r.get("compute_slowdown"),
                              "push_efficiency": link.get("push_efficiency"), "compute_s": r["compute_s"],
                              "compute_s_unpadded": r["compute_s"] / nominal}}
            for k in ("bench_predicted_s", "old_bench_cluster_s", "old_s", "new_s", "new_job_median_s"):
                row["error_" + k[:-2]] = prediction_error(row[k], measured_s)
            rows.append(row)
            print(f"{row['file'][:34]:34s} {r['strategy'][:44]:44s} {1e3 * measured_s:6.1f} ms"
                  f" | bench {pct(row['error_bench_predicted'])}"
                  f" old(bench cluster) {pct(row['error_old_bench_cluster'])} old {pct(row['error_old'])}"
                  f" new {pct(row['error_new'])} new median {pct(row['error_new_job_median'])}", flush=True)
    if args.json:
        write_json(args.json, {"format": "caramel.gossip-sim-replay/1", "ref": args.ref,
                               "command": "python -m experiments.gossip_sim_replay " + " ".join(sys.argv[1:]),
                               "profile": args.profile,
                               "profile_step_s": {k[0]: p.step_time_s for k, p in profiles.items()}, "rows": rows})


if __name__ == "__main__":
    main()
