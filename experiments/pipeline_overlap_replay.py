"""The pipeline simulator, old against new, on recorded bench runs: "old" starts each
activation's or gradient's transfer when its action ends (`transport="eager"`), "new" when the
schedule has posted both ends (`transport="rendezvous"`, `caramel/strategies/pipeline/transport.py`);
both with the replicas' reduction overlapped as the runtime runs it (`overlap.py`). "drain" is
the model before that (`reduce="after"`, eager), kept in the JSON for comparison.

Two kinds of input:

- `--exact RUN_DIR...`: runs recorded with `--trace` (`bench.json` and
  `trace/*/prediction_inputs.json`): each pipeline row's prediction replayed from the run's own
  inputs, as the bench made it (`experiments/pipeline_contention.py`'s cluster), both ways.
- `--rebuilt RUN_DIR...`: runs recorded without their inputs (the bench JSON only). The profile
  is borrowed (`--profile`: a saved `prediction_inputs.json` or `caramel profile` JSON of the same
  model; resized to the run's batch through its two-size fit), the link from the record
  (`link_fit`, `compute_slowdown`), and every worker's speed scaled by one factor chosen so that
  the model's DDP prediction equals the one the run recorded. The drain model's pipeline
  predictions on it are set beside the recorded ones: they show how close the rebuilt inputs
  are. An approximation, said so in every row.

    PYTHONPATH=. python experiments/pipeline_overlap_replay.py --exact docs/results/pipeline_contention/run_d3 \
        --rebuilt docs/results/pipeline_replicas_auto/run_h --profile PROFILE.json --json out.json
"""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from experiments.pipeline_contention import inputs_cluster, measured_actions


def _both(prof, cluster, strategy: str) -> tuple[float, float, dict, dict, float]:
    """The old model (eager transfers) and the new one (rendezvous), both with the reduction as
    the runtime runs it; and the drain model's step (`reduce="after"`, eager)."""
    from caramel.strategies import STRATEGIES
    from caramel.strategies.pipeline.simulate import simulate_pipeline

    options = STRATEGIES.spec(strategy).options
    new = simulate_pipeline(prof, cluster, options)
    old = simulate_pipeline(prof, cluster, options, transport="eager")
    drain = simulate_pipeline(prof, cluster, options, reduce="after", transport="eager")
    return old.step_time_s, new.step_time_s, old.meta, new.meta, drain.step_time_s


LAYOUT = ("stages", "replicas", "microbatches", "boundaries")


def _row(run: str, rec: dict[str, Any], old: float, new: float, old_meta: dict, meta: dict, drain: float,
         note: str) -> dict[str, Any]:
    measured = rec["step_time_median_s"]
    ran = rec.get("pipeline") or {}
    return {"run": run, "configuration": f"{rec['model']} x{rec['workers']} @ {rec['bandwidth']}",
            "strategy": rec["strategy"], "measured_ms": 1e3 * measured,
            "recorded_prediction_ms": 1e3 * rec["predicted_step_s"] if rec.get("predicted_step_s") else None,
            "old_ms": 1e3 * old, "new_ms": 1e3 * new, "old_error": old / measured - 1, "new_error": new / measured - 1,
            "drain_ms": 1e3 * drain, "drain_error": drain / measured - 1,
            "reduce_model": meta.get("replica_reduce_model"), "layout": {k: meta.get(k) for k in LAYOUT},
            "old_layout": {k: old_meta.get(k) for k in LAYOUT},
            "ran_layout": {**{k: ran.get(k) for k in LAYOUT}, "boundaries": [str(b) for b in ran.get("boundaries") or []]},
            "inputs": note}


def _ran_options(strategy: str, ran: dict[str, Any]):
    """The strategy's options pinned to the layout the run recorded (stages, equal replicas,
    microbatches per pipeline, cut)."""
    import dataclasses

    from caramel.strategies import STRATEGIES

    return dataclasses.replace(STRATEGIES.spec(strategy).options, stages=ran["stages"], replicas=ran["replicas"],
                               microbatches=ran["microbatches"], partition="+".join(ran["boundaries"]))


def _with_measured_compute(prof, cluster, options, per_rank: list[dict[str, float]]) -> tuple[float, float]:
    """Old and new steps of `options` (an equal layout, pinned: no chooser runs, so every replay
    below is of that one layout) with each stage's forward and backward per microbatch replaced
    by the mean over its ranks of the run's own timed actions
    (`pipeline_contention.measured_actions`: wall time, contention included, so no slowdown is
    added); the buckets' ready and need times scaled alike. Isolates the reduction's pricing
    from the profile's compute."""
    import dataclasses

    from caramel.strategies.pipeline import simulate as sim

    replay, overlapped = sim.replay, sim.replay_overlapped
    r = options.replicas  # rank = position x replicas + replica

    def measured(costs):
        n = len(costs.forward_s)
        if len(per_rank) != n * r:
            raise ValueError(f"measured compute: {len(per_rank)} ranks for {n} stages x {r} replicas")
        fwd = [sum(per_rank[s * r + j]["F"] for j in range(r)) / r / 1e3 for s in range(n)]
        bwd = [sum(per_rank[s * r + j]["B"] for j in range(r)) / r / 1e3 for s in range(n)]
        buckets = [dataclasses.replace(b, ready_s=[t * bw / costs.backward_s[s] for t in b.ready_s],
                                       need_s=[t * fw / costs.forward_s[s] for t in b.need_s])  # the rest (cpu_s) kept
                   for s, (b, fw, bw) in enumerate(zip(costs.buckets, fwd, bwd))]
        return dataclasses.replace(costs, forward_s=fwd, backward_s=bwd, buckets=buckets)

    sim.replay = lambda costs, actions, slowdown=1.0, period=0, posting=None: replay(measured(costs), actions, 1.0,
                                                                                      period, posting)
    sim.replay_overlapped = lambda costs, actions, mode, slowdown=1.0, posting=None: overlapped(
        measured(costs), actions, mode, 1.0, posting=posting)
    try:
        new = sim.simulate_pipeline(prof, cluster, options).step_time_s
        old = sim.simulate_pipeline(prof, cluster, options, transport="eager").step_time_s
    finally:
        sim.replay, sim.replay_overlapped = replay, overlapped
    return old, new


def exact(run_dir: Path) -> list[dict[str, Any]]:
    bench = json.loads((run_dir / "bench.json").read_text())
    rows = []
    for inputs in sorted((run_dir / "trace").glob("*/prediction_inputs.json")):
        prof, cluster = inputs_cluster(json.loads(inputs.read_text()))
        tag = inputs.parent.name.split("-")  # NN-model-wW-rate
        for rec in bench["records"]:
            if (not rec["strategy"].startswith("pipeline") or rec["step_time_median_s"] is None
                    or f"w{rec['workers']}" != tag[-2] or rec["bandwidth"] != tag[-1] or rec["model"] not in tag[1]):
                continue
            row = _row(run_dir.name, rec, *_both(prof, cluster, rec["strategy"]), "exact: the run's own inputs")
            per_rank = measured_actions(inputs.parent, rec["strategy"], 4)
            if per_rank and all(a["F"] and a["B"] for a in per_rank) and rec.get("pipeline", {}).get("replicas") in (2, 3, 4):
                old, new = _with_measured_compute(prof, cluster, _ran_options(rec["strategy"], rec["pipeline"]),
                                                  per_rank)
                row.update(measured_compute_old_ms=1e3 * old, measured_compute_new_ms=1e3 * new,
                           measured_compute_old_error=1e3 * old / row["measured_ms"] - 1,
                           measured_compute_new_error=1e3 * new / row["measured_ms"] - 1,
                           measured_f_b_ms_per_rank=per_rank)
            rows.append(row)
    return rows


def resized(prof, batch: int):
    """`prof` at another batch size: each module's time on the line through its two timed sizes
    (`small_batch_size`), its activation bytes in proportion."""
    out = copy.deepcopy(prof)
    b, s = prof.batch_size, prof.small_batch_size
    for m in out.modules:
        for big, small in (("forward_time_s", "small_batch_forward_time_s"), ("backward_time_s", "small_batch_backward_time_s")):
            t, ts = getattr(m, big), getattr(m, small)
            slope = (t - ts) / (b - s)
            setattr(m, big, max(t + slope * (batch - b), 0.0))
        if m.input_bytes:
            m.input_bytes = int(m.input_bytes * batch / b)
    scale = sum(m.forward_time_s for m in out.modules) / max(sum(m.forward_time_s for m in prof.modules), 1e-12)
    out.forward_time_s *= scale
    out.backward_time_s *= scale
    out.batch_size = batch
    return out


def rebuilt(run_dir: Path, profile_path: Path) -> list[dict[str, Any]]:
    from caramel.bench.prediction import bench_cluster
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict

    bench = json.loads((run_dir / "bench.json").read_text())
    raw = json.loads(profile_path.read_text())
    base = ModelProfile.from_dict(raw.get("profile", raw))
    rows = []
    ddp = next(r for r in bench["records"] if r["strategy"] == "ddp")
    prof = resized(base, ddp["batch_size"]) if ddp.get("batch_size") and ddp["batch_size"] != base.batch_size else base
    fit = ddp["link_fit"]
    link = {k: fit[k] for k in ("latency_s", "queued_latency_s", "collective_cpu_s")}

    def cluster_at(speed: float):
        return bench_cluster(ddp["workers"], fit["net_bandwidth_bps"], [speed] * ddp["workers"], link,
                             ddp["compute_slowdown"])

    lo, hi = 0.05, 20.0  # the speed at which the DDP model gives the recorded DDP prediction (monotone)
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        (p,) = predict(prof, cluster_at(mid), ["ddp"])
        lo, hi = (mid, hi) if p.step_time_s > ddp["predicted_step_s"] else (lo, mid)
    cluster = cluster_at((lo * hi) ** 0.5)
    note = (f"rebuilt: profile {profile_path} at batch {prof.batch_size}, link from the record, speeds "
            f"{cluster.workers[0].speed:.3f} (DDP's recorded prediction)")
    for rec in bench["records"]:
        if rec["strategy"].startswith("pipeline") and rec["step_time_median_s"] is not None:
            rows.append(_row(run_dir.name, rec, *_both(prof, cluster, rec["strategy"]), note))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exact", nargs="*", default=[], help="run directories with bench.json and trace/")
    ap.add_argument("--rebuilt", nargs="*", default=[], help="run directories with bench.json only")
    ap.add_argument("--profile", action="append", default=[],
                    help="MODEL=PATH: the profile borrowed for --rebuilt runs of that model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    profiles = dict(p.split("=", 1) for p in args.profile)
    rows = [r for d in args.exact for r in exact(Path(d))]
    for d in args.rebuilt:
        model = json.loads((Path(d) / "bench.json").read_text())["records"][0]["model"]
        rows += rebuilt(Path(d), Path(profiles[model]))
    for r in rows:
        rec = f"{r['recorded_prediction_ms']:.1f}" if r["recorded_prediction_ms"] else "-"
        print(f"{r['run']:6} {r['strategy'][:44]:44} measured {r['measured_ms']:6.1f}  recorded {rec:>6}  "
              f"drain {r['drain_ms']:6.1f} ({r['drain_error']:+.0%})  "
              f"old {r['old_ms']:6.1f} ({r['old_error']:+.0%})  new {r['new_ms']:6.1f} ({r['new_error']:+.0%})  "
              f"[{r['reduce_model']}] {r['layout']}")
        if r["old_layout"] != r["layout"]:
            print(f"{'':6} old model's layout {r['old_layout']}")
        if r["ran_layout"]["stages"] is not None and any(r["ran_layout"][k] != r["layout"][k] for k in LAYOUT):
            print(f"{'':6} the run ran {r['ran_layout']}")
        if "measured_compute_new_ms" in r:
            print(f"{'':6} with the run's measured F/B per stage: old {r['measured_compute_old_ms']:6.1f} "
                  f"({r['measured_compute_old_error']:+.0%})  new {r['measured_compute_new_ms']:6.1f} "
                  f"({r['measured_compute_new_error']:+.0%})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
