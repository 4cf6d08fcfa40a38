"""The pipeline simulator's terms, replayed on a bench run's own measurements.

`caramel bench ... --trace DIR` writes, per configuration, the inputs of the bench's
predictions (`prediction_inputs.json`: the profile, each rank's compute-only baseline, the
concurrent baseline's spans, the link probe) and every pipeline rank's timed compute actions.
This replays each pipeline strategy's prediction from those inputs four ways:

- `plain`: no contention and no send completion (compute_slowdown 1, one schedule per lane);
- `sends`: a rank on several virtual pipelines starts the next once its sends have landed;
- `model`: and compute beside a transfer slowed by the measured factor (the model before
  gloo's rendezvous: a transfer starts when its action ends);
- `posted`: and each transfer as the schedule posts it, starting once the receiver's recv is
  posted (the simulator's model, `transport.py`);

(`sends`, `model` and `posted` queue a lane's sends on its link and end a lane's part of the
step at its last send's landing, which the simulator before these terms did not: on the runs in
docs/results/pipeline_contention/ that changed one prediction, `1+2` of run A, 207.6 -> 213.8 ms)

and sets beside the measured step each rank's measured busy time (median per step) against
the model's busy time per lane, and the median forward and backward per microbatch of each
rank against the model's per-stage costs. Nothing is fitted: the factor is the job's own
concurrent-baseline measurement (`caramel.bench.contention`).

    PYTHONPATH=. python experiments/pipeline_contention.py --bench run.json --trace DIR [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def inputs_cluster(d: dict[str, Any]):
    """The profile and the cluster the bench derived from a run's `prediction_inputs.json`: the
    spec the pipeline runtime plans at (`caramel.bench.pipeline_plan.plan_cluster`), the
    prediction's "base" cluster with the profile's host sharing; under `--jitter` without the
    prediction's unpadded transfer CPU share (docs/pipeline.md)."""
    from caramel.bench.pipeline_plan import plan_cluster
    from caramel.profile.model_profile import ModelProfile

    prof = ModelProfile.from_dict(d["profile"])
    cluster = plan_cluster(prof, d["world"], d["grad_bytes"], d["comm_s"], d["comm_buckets"], d["rank_compute_s"],
                           d["spans"], d["probed"])
    if cluster is None:
        raise SystemExit(f"no net link rate in {d.get('config', 'the inputs')}: nothing to replay")
    return prof, cluster


def pinned(prof, cluster, options):
    """`options` with replicas="auto" resolved (unpatched, as the bench resolved it): the layout
    is fixed before any term of the model is switched off, so the chooser's candidates are not
    priced with the terms under test."""
    from caramel.strategies.pipeline import simulate as sim

    return sim._auto_replicas(prof, cluster, options)[0] if options.auto_replicas else options


def _simulate(prof, cluster, options, terms: str) -> tuple[float, list[float], Any]:
    """The step, the busy time per lane and the stage costs, with `terms` of the model. Equal
    hybrids of gpipe/1f1b replay through `overlap.replay_overlapped` (their reduction
    overlapped, as priced since docs/results/pipeline_overlap/), the rest through `replay`."""
    from caramel.strategies.pipeline import simulate as sim

    seen: dict[str, Any] = {}
    replay, overlapped = sim.replay, sim.replay_overlapped

    contended = terms in ("model", "posted")

    def spy(costs, actions, slowdown=1.0, period=0, posting=None):
        out = replay(costs, actions, slowdown if contended else 1.0, period if terms != "plain" else 0,
                     posting if terms == "posted" else None)
        seen.update(costs=costs, busy=out.busy_s)
        return out

    def spy_overlapped(costs, actions, mode, slowdown=1.0, posting=None):  # one schedule per lane: no period to drop
        out = overlapped(costs, actions, mode, slowdown if contended else 1.0,
                         posting=posting if terms == "posted" else None)
        seen.update(costs=costs, busy=out.busy_s)
        return out

    options = pinned(prof, cluster, options)
    sim.replay, sim.replay_overlapped = spy, spy_overlapped
    try:
        result = sim.simulate_pipeline(prof, cluster, options)
    finally:
        sim.replay, sim.replay_overlapped = replay, overlapped
    return result.step_time_s, seen["busy"], seen["costs"], result.meta["replica_reduce_model"]


def measured_actions(trace: Path, strategy: str, skip: int) -> list[dict[str, float]]:
    """Per rank: median forward and backward per microbatch (ms), from its timed actions."""
    from caramel.bench.strategies import trace_file_stem

    out = []
    for f in sorted(trace.glob(f"pipeline_actions.{trace_file_stem(strategy)}.rank*.json"),
                    key=lambda p: int(p.stem.rpartition("rank")[2])):
        steps = json.loads(f.read_text())["steps"][skip:]
        row = {}
        for kind in "FB":
            durs = [b - a for st in steps for k, _, mb, a, b in st if k == kind and mb >= 0]
            row[kind] = round(1e3 * statistics.median(durs), 2) if durs else None
        out.append(row)
    return out


def replay_run(bench: dict[str, Any], trace_root: Path, skip: int) -> list[dict[str, Any]]:
    from caramel.strategies import STRATEGIES

    rows = []
    for inputs in sorted(trace_root.glob("*/prediction_inputs.json")):
        prof, cluster = inputs_cluster(json.loads(inputs.read_text()))
        tag = inputs.parent.name.split("-")  # NN-model-wW-rate
        for rec in bench["records"]:
            if (not rec["strategy"].startswith("pipeline") or rec["step_time_median_s"] is None or f"w{rec['workers']}" != tag[-2]
                    or rec["bandwidth"] != tag[-1] or rec["model"] not in tag[1]):
                continue
            options = STRATEGIES.spec(rec["strategy"]).options
            measured = rec["step_time_median_s"]
            steps = {t: _simulate(prof, cluster, options, t) for t in ("plain", "sends", "model", "posted")}
            costs = steps["model"][2]
            rows.append({
                "configuration": inputs.parent.name, "strategy": rec["strategy"],
                "compute_slowdown": cluster.compute_slowdown, "measured_ms": 1e3 * measured,
                "bench_predicted_ms": 1e3 * rec["predicted_step_s"] if rec.get("predicted_step_s") else None,
                **{f"{t}_ms": 1e3 * s for t, (s, _, _, _) in steps.items()},
                **{f"{t}_error": s / measured - 1 for t, (s, _, _, _) in steps.items()},
                "measured_busy_ms_per_rank": [1e3 * b for b in (rec.get("pipeline") or {}).get("busy_s_per_stage", [])],
                "model_busy_ms_per_lane": [1e3 * b for b in steps["posted"][1]],
                "measured_f_b_ms_per_rank": measured_actions(inputs.parent, rec["strategy"], skip),
                "model_f_b_ms_per_stage": [{"F": round(1e3 * f, 2), "B": round(1e3 * b, 2)}
                                           for f, b in zip(costs.forward_s, costs.backward_s)],
                "model_transfer_ms": [1e3 * t for t in costs.transfer_s],
                # the serial all-reduce per stage; "forward"/"backward" replay it per bucket, overlapped
                "model_allreduce_ms": [1e3 * t for t in costs.allreduce_s],
                "model_replica_reduce": steps["model"][3]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="the bench's --json output")
    ap.add_argument("--trace", required=True, help="the bench's --trace directory")
    ap.add_argument("--skip", type=int, default=4, help="warm-up steps left out of the action medians")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = replay_run(json.loads(Path(args.bench).read_text()), Path(args.trace), args.skip)
    for r in rows:
        print(f"{r['configuration']} {r['strategy']} (f {r['compute_slowdown']:.2f}): measured {r['measured_ms']:.1f} ms; "
              + ", ".join(f"{t} {r[t + '_ms']:.1f} ({r[t + '_error']:+.0%})" for t in ("plain", "sends", "model", "posted")))
        print(f"    busy per rank measured {[round(b, 1) for b in r['measured_busy_ms_per_rank']]}, "
              f"model {[round(b, 1) for b in r['model_busy_ms_per_lane']]}")
        print(f"    F/B per rank measured {r['measured_f_b_ms_per_rank']}, model per stage {r['model_f_b_ms_per_stage']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": args.bench, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
