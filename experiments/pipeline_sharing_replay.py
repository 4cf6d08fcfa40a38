"""A bench run's pipeline predictions with and without the host-sharing model, and what its traces say.

For each run directory (`bench.json` and `trace/<config>/` with `prediction_inputs.json` and the
pipelines' `pipeline_actions.*.rank*.json`, as `caramel bench --trace` writes them):

- each pipeline row's prediction from the run's saved inputs, at the all-at-once speeds (the
  model before `caramel.strategies.pipeline.sharing`) and with the sharing the profile's turns
  measured (`meta["host_sharing"]`), beside the measured median;
- from the traces (all ranks on one host, one monotonic clock): how many ranks computed at once
  over all compute time (`sharing.co_computing`), and each rank's compute per step.

    PYTHONPATH=. python experiments/pipeline_sharing_replay.py docs/results/pipeline_profile_turns/run_m

With `REPLAY_JSON=OUT` in the environment it also writes the rows, keyed by run directory, to
OUT (`"format": "caramel.pipeline-sharing-replay/1"` beside the run keys).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))


def replay(run: str) -> list[dict]:
    from pipeline_contention import inputs_cluster

    from caramel.bench.strategies import trace_file_stem
    from caramel.profile.turns import sharing_of
    from caramel.strategies import STRATEGIES
    from caramel.strategies.pipeline.sharing import co_computing

    (trace,) = glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json"))
    inputs = json.load(open(trace))
    prof, plain = inputs_cluster(inputs)
    shared = dataclasses.replace(plain, **sharing_of(prof))
    bench = json.load(open(os.path.join(run, "bench.json")))
    rows = []
    for rec in bench["records"]:
        name = rec["strategy"]
        if not name.startswith("pipeline"):
            continue
        before = STRATEGIES.spec(name).simulate(prof, plain, 4)
        after = STRATEGIES.spec(name).simulate(prof, shared, 4)
        stem = trace_file_stem(name)
        lanes, busy, per_action = [], [], []
        for f in sorted(glob.glob(os.path.join(os.path.dirname(trace), f"pipeline_actions.{stem}.rank*.json"))):
            steps = json.load(open(f))["steps"]
            acts = [a for st in steps for a in st if a[2] >= 0]  # microbatch -1: bookkeeping
            spans = [(a[3], a[4]) for a in acts]
            lanes.append(spans)
            busy.append(sum(b - a for a, b in spans) / len(steps))
            per_action.append({k: statistics.median([a[4] - a[3] for a in acts if a[0] == k]) for k in ("F", "B")})
        measured = rec["step_time_median_s"]
        rows.append({"strategy": name, "measured_s": measured,
                     "all_at_once_s": before.step_time_s, "shared_s": after.step_time_s,
                     "sharing": after.meta.get("sharing"),
                     "busy_s_per_lane": {"all_at_once": before.meta["busy_s_per_lane"],
                                         "shared": after.meta["busy_s_per_lane"]},
                     "measured_ranks_at_once": co_computing(lanes) if lanes else None,
                     "measured_busy_s_per_rank": busy,
                     # per microbatch: the model's lane compute over its microbatches, the traces' median F + B
                     # (equal layouts only: there every lane runs all of its pipeline's microbatches)
                     "microbatches_per_rank": after.meta["microbatches"] if isinstance(after.meta["replicas"], int)
                     and not isinstance(after.meta["replicas"], bool) else None,
                     "measured_action_s_per_rank": per_action})
    return rows


def main(argv: list[str]) -> int:
    if "format" in argv:
        raise SystemExit("a run directory named 'format' would clash with the output's format tag; rename it")
    out = {}
    for run in argv:
        out[run] = rows = replay(run)
        for r in rows:
            m = r["measured_s"]
            err = (lambda p: f"{100 * (p / m - 1):+.0f}%") if m else (lambda p: "")
            s = r["sharing"] or {}
            print(f"{run}: {r['strategy']}: measured {1e3 * m:.1f} ms; all at once {1e3 * r['all_at_once_s']:.1f} "
                  f"({err(r['all_at_once_s'])}), shared {1e3 * r['shared_s']:.1f} ({err(r['shared_s'])}); "
                  f"factor {s.get('factor', 1):.2f}, ranks at once modelled {s.get('ranks_at_once', 0):.2f}, "
                  f"measured {r['measured_ranks_at_once'] or 0:.2f}; busy ms per lane "
                  f"{[round(1e3 * b, 1) for b in r['busy_s_per_lane']['all_at_once']]} -> "
                  f"{[round(1e3 * b, 1) for b in r['busy_s_per_lane']['shared']]}, measured per rank "
                  f"{[round(1e3 * b, 1) for b in r['measured_busy_s_per_rank']]}")
            m_ = r["microbatches_per_rank"]
            if not m_ or len(r["busy_s_per_lane"]["shared"]) * 2 != len(r["measured_action_s_per_rank"]):
                continue  # per microbatch: the equal 2-stage hybrids' lanes (2 ranks each) only
            print(f"    per microbatch, forward + backward: modelled per lane all at once "
                  f"{[round(1e3 * b / m_, 1) for b in r['busy_s_per_lane']['all_at_once']]}, shared "
                  f"{[round(1e3 * b / m_, 1) for b in r['busy_s_per_lane']['shared']]}; measured median per rank "
                  f"{[round(1e3 * (a['F'] + a['B']), 1) for a in r['measured_action_s_per_rank']]}")
    if os.environ.get("REPLAY_JSON"):
        from caramel.jsonio import format_tag, write_json
        write_json(os.environ["REPLAY_JSON"], {"format": format_tag("pipeline-sharing-replay"), **out})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
