"""What the bench's ps rows measure per step against what the simulator predicts (untimed replay).

The bench times a strategy in blocks (`caramel.bench.blocks.measure_block`): a barrier, one
unmeasured entry step, `steps_per_round` timed steps, then `finish()` (`synchronize()` for ps),
which drains what is still pending, unmeasured. Under bsp that drain is one update's pulls, as
the entry step's were owed to the first timed forward: the window carries a steady state's bytes.
Under `ssp:S` a forward of step t waits only for update t - 1 - S and `step()` only for the
reductions of update t - S, so up to S updates' transfers more than bsp's are left to the
untimed drain, and every block starts from an empty backlog. The simulator predicts the steady
state (the second half of a long unroll), which is a different quantity.

For every ps row of the given bench JSONs (their saved `meta.prediction_inputs`), this prints:

- the bytes the runtime puts on each rank's link per update (from the plan: its pushes to the
  other servers, and its own shard's pull broadcast to the n - 1 others) and that at the link's
  achieved rate (the comm-only baseline's, the predictions' `bandwidth_bps`): the steady floor
  of the one-link rule;
- how many updates' pushes and pulls the runtime's rules force inside one timed block, and the
  floor scaled by that share of a steady block's transfers;
- the simulator's steady prediction (the recorded one) and the same simulator's step times over
  the bench's block: from a clean start, the entry step, `steps_per_round` steps, per step index
  the slowest rank's clock advance (`caramel.bench.step_metrics.job_step_times`), the median;
- the measured median and mean.

Nothing is fitted and no model is changed.

    PYTHONPATH=. python experiments/ps_ssp_block.py docs/results/ps_sim_flow_fresh/w2/bench.json \
        docs/results/ps_sim_flow_fresh2/w2/bench.json [--json OUT.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys


def link_bytes_per_update(profile, options, n: int) -> list[float]:
    """Bytes each rank sends per update, colocated flat servers (shard k served by rank k):
    its push of every bucket another rank serves, and its own shard's pulls to the n - 1 others."""
    from caramel.strategies.ps.planner import make_ps_plan
    shards = options.check_world(n, 1, 0)
    plan = make_ps_plan(profile, options, shards)
    size = {p.index: p.bytes for p in profile.params}
    total = sum(size[i] for i in plan.params)
    own = [sum(size[i] for i in plan.params if plan.owner[i] == s) for s in range(shards)] + [0] * (n - shards)
    return [(total - own[w]) + (n - 1) * own[w] for w in range(n)]


def forced_in_block(steps: int, bound: int) -> tuple[int, int]:
    """(pushes, pulls) the runtime's rules make land inside a block of `steps` timed steps after
    one entry step (updates 0..steps), starting synchronized: step t's `step()` waits for the
    reductions of update t - bound (pushes 1..steps - bound; update 0's were handed over in the
    entry step), its forward for the pulls of update t - 1 - bound (updates 0..steps - 1 - bound)."""
    return max(steps - bound, 0), max(steps - bound, 0)


def block_times_s(result, n: int, steps: int) -> list[float]:
    """The simulator's per-step times over the bench's block: entry step 0 untimed, steps
    1..`steps` timed on each rank from the end of its entry step, per index the slowest rank's
    clock advance (`job_step_times`)."""
    from caramel.bench.step_metrics import job_step_times
    ends = [[0.0] * (steps + 1) for _ in range(n)]
    for e in result.trace.events:
        if e.kind == "step" and e.iteration <= steps:
            ends[e.rank][e.iteration] = e.end_s
    rank_times = [[ends[w][k] - ends[w][k - 1] for k in range(1, steps + 1)] for w in range(n)]
    return job_step_times(rank_times)


def rows(path: str) -> list[dict]:
    from caramel.bench.record import Record, config_label
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies import STRATEGIES
    from caramel.topology.spec import ClusterSpec

    with open(path) as f:
        d = json.load(f)
    steps = int(d["meta"]["settings"]["steps_per_round"])
    fields = set(Record.__dataclass_fields__)
    out = []
    for label, pi in d["meta"]["prediction_inputs"].items():
        prof = ModelProfile.from_dict(pi["profile"])
        cluster = ClusterSpec.from_dict(copy.deepcopy(pi["clusters"]["base"]))
        n = cluster.world_size
        for r in d["records"]:
            if r["strategy"].split(":", 1)[0] != "ps":
                continue
            if config_label(Record(**{k: v for k, v in r.items() if k in fields})) != label:
                continue
            spec = STRATEGIES.spec(r["strategy"])
            options = spec.options
            bound = options.staleness_bound()
            res = spec.simulate(prof, cluster, 4)  # the bench's call: the recorded prediction
            # the unroll's first steps do not depend on its length: one long enough for the block
            unrolled = spec.simulate(prof, cluster, steps + 1)
            per_update = link_bytes_per_update(prof, options, n)
            floor_s = max(per_update) * 8 / cluster.bandwidth_bps
            pushes, pulls = forced_in_block(steps, bound)
            block = block_times_s(unrolled, n, steps)
            out.append({
                "run": os.path.normpath(path), "config": label, "strategy": r["strategy"], "bound": bound,
                "steps_per_round": steps, "rate_bps": cluster.bandwidth_bps,
                "link_bytes_per_update": per_update, "floor_s": floor_s,
                "forced_pushes": pushes, "forced_pulls": pulls,
                "floor_block_s": floor_s * (pushes + pulls) / (2 * steps),
                "measured_median_s": r["step_time_median_s"], "measured_mean_s": r["step_time_mean_s"],
                "round_medians_s": r["round_medians_s"],
                "predicted_steady_s": res.step_time_s, "recorded_prediction_error": r.get("prediction_error"),
                "predicted_block_s": block, "predicted_block_median_s": statistics.median(block),
                "predicted_block_mean_s": statistics.mean(block),
            })
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json", nargs="+")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    all_rows = []
    for path in args.bench_json:
        with open(path) as f:
            if not (json.load(f).get("meta") or {}).get("prediction_inputs"):
                print(f"ps_ssp_block: {path} has no meta.prediction_inputs (nothing to replay)", file=sys.stderr)
                return 2
        all_rows += rows(path)
    ms = lambda s: f"{1e3 * s:.1f}"  # noqa: E731
    print("run | config | strategy | MB/update (busiest rank) | floor ms | forced in block (pushes, pulls of "
          "2x steps) | floor x share | steady pred | err | block pred median (mean) | err | measured median (mean)")
    for x in all_rows:
        m = x["measured_median_s"]
        print(f"{x['run']} | {x['config']} | {x['strategy']} | {max(x['link_bytes_per_update']) / 1e6:.2f} | "
              f"{ms(x['floor_s'])} | {x['forced_pushes']}+{x['forced_pulls']} of {2 * x['steps_per_round']} | "
              f"{ms(x['floor_block_s'])} | {ms(x['predicted_steady_s'])} | {100 * (x['predicted_steady_s'] / m - 1):+.1f}% | "
              f"{ms(x['predicted_block_median_s'])} ({ms(x['predicted_block_mean_s'])}) | "
              f"{100 * (x['predicted_block_median_s'] / m - 1):+.1f}% | {ms(m)} ({ms(x['measured_mean_s'])})")
        print("    block steps ms: " + " ".join(ms(t) for t in x["predicted_block_s"])
              + " | measured round medians ms: " + " ".join(ms(t) for t in x["round_medians_s"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"format": "caramel.ps_ssp_block/1", "rows": all_rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
