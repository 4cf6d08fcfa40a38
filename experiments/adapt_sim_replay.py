"""Replay a bench file's recorded predictions with one input changed, to say where a miss comes from.

For every record with a prediction it re-runs the strategy's simulator on the saved profile and
cluster (`prediction_inputs`, caramel.bench/3) and prints, against the measured median: the
recorded prediction, the replay (equal to it when nothing changed), the replay without the
contention factor, and, for a `balance="batch"` row, plain caramel on workers slowed to the
shares the run reached (`share_counts`) instead of the simulator's shares proportional to speed.
The last uses a decision the run took, so it diagnoses; it is no prediction.

    python experiments/adapt_sim_replay.py docs/results/adapt-sim-slow-worker.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def replay(path: Path) -> list[str]:
    bench = json.loads(path.read_text())
    inputs = bench["meta"]["prediction_inputs"]
    if len(inputs) != 1:  # records do not name their configuration, so the profile must be the only one
        raise SystemExit(f"{path}: expected a bench file with one configuration, found {len(inputs)}: "
                         + (", ".join(repr(k) for k in inputs) or "none"))

    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict
    from caramel.topology.spec import ClusterSpec

    (profile,) = (ModelProfile.from_dict(i["profile"]) for i in inputs.values())
    lines = []
    for r in bench["records"]:
        if r.get("predicted_step_s") is None:
            continue
        base = ClusterSpec.from_dict(r["prediction_inputs"]["clusters"][r["prediction_cluster"]])

        def step_s(cluster: ClusterSpec, name: str = r["strategy"]) -> float:
            (p,) = predict(profile, cluster, [name])
            return p.step_time_s

        rows = {"recorded": r["predicted_step_s"], "replayed": step_s(base),
                "no contention factor": step_s(dataclasses.replace(base, compute_slowdown=1.0))}
        if r.get("share_counts"):
            counts = r["share_counts"]
            equal = sum(counts) / len(counts)  # the profile's local batch
            workers = [dataclasses.replace(w, speed=w.speed * equal / n) for w, n in zip(base.workers, counts)]
            rows[f"reached shares {counts} as caramel"] = step_s(dataclasses.replace(base, workers=workers), "caramel")
        measured = r["step_time_median_s"]
        lines.append(f"{r['strategy']}: measured {1e3 * measured:.1f} ms; " + "; ".join(
            f"{k} {1e3 * v:.1f} ms ({v / measured - 1:+.1%})" for k, v in rows.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    print("\n".join(replay(parser.parse_args().bench_json)))


if __name__ == "__main__":
    main()
