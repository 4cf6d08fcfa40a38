"""Why the simulator over-predicts the 2-worker `ps:consistency=ssp:2` steady-block rows (issue 28).

Replays every ps row of the given bench JSONs (bsp beside ssp, their saved
`meta.prediction_inputs`, nothing fitted) and splits predicted against measured into terms:

- the recorded steady prediction = max(period, long-run bound): the slowest rank's mean steady
  step (`periods_s`), its pieces (forward compute, forward's pull wait, backward, `step()` with
  its apply and reduction waits), and the bound no step beats in the long run (one server's
  pulls then the other server's pushes back to back on a rank's link, at the probe's rates);
- the same transfers at the comm-only baseline's rate (efficiency 1) and the measured comm-only
  baseline (`comm_s`, the whole exchange through the link alone);
- the bench's block replayed (S + 1 untimed entry steps for `ssp:S`, 1 otherwise; 8 timed
  steps; the drain untimed): the model's per-step times, their median and mean;
- a what-if, post hoc, not a model change: the runtime's early apply on gloo colocated (a
  not-yet-due update applied once every rank handed over its pushes, docs/ps.md "Consistency"),
  put into an in-memory copy of the simulator (the patch of ps_ssp_block_early_apply.diff);
  and both what-ifs at once (early apply at the link's rate).

The simulator is run from a copy of caramel/strategies/ps/simulate.py with two textual edits
(instrumentation; the what-if switch); the edits must each match once, else this stops.

    PYTHONPATH=. python experiments/ps_ssp_terms.py docs/results/ps_ssp_steady_block/bench.json \
        docs/results/ps_sim_pull_flows/w2/bench.json docs/results/ps_sim_probe5/w2/bench.json \
        [--json OUT.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import types

# (old, new) edits on the simulator's source; each must match exactly once
TERMS_EDIT = ('"periods_s": periods,', '"periods_s": periods, "bound_terms": {"group_s": group_s, '
              '"pushes_to_s": pushes_to, "pulls_of_s": pulls_of},')
EARLY_EDITS = [
    ("    reduced: dict[int, float] = {}",
     "    counted: dict[int, float] = {}\n    reduced: dict[int, float] = {}"),
    ("        reduced[k] = max(push_end) + 2 * (n + dedicated - 1) * alpha\n",
     "        reduced[k] = max(push_end) + 2 * (n + dedicated - 1) * alpha\n"
     "        counted[k] = max(bwd_end) + 2 * (n + dedicated - 1) * alpha\n"),
    ("                if u <= k - S:\n",
     "                if u <= k - S or (EARLY_APPLY and links is not None and local == 1 and counted[u] <= t):\n"),
]


def load_simulator(early_apply: bool) -> types.ModuleType:
    """An in-memory copy of the ps simulator with `bound_terms` in its meta and, if
    `early_apply`, the runtime's early-apply rule (what-if only)."""
    import caramel.strategies.ps.simulate as orig
    with open(orig.__file__) as f:
        src = f.read()
    for old, new in [TERMS_EDIT] + EARLY_EDITS:
        if src.count(old) != 1:
            raise SystemExit(f"ps_ssp_terms: the simulator's source changed: {old.strip()!r} found "
                             f"{src.count(old)} times, expected once")
        src = src.replace(old, new)
    name = f"caramel.strategies.ps._simulate_terms_{int(early_apply)}"
    mod = types.ModuleType(name)
    mod.__file__ = orig.__file__
    mod.EARLY_APPLY = early_apply
    sys.modules[name] = mod
    exec(compile(src, orig.__file__, "exec"), mod.__dict__)
    return mod


def block_times_s(result, n: int, entry: int, steps: int) -> list[float]:
    """The model's per-step times over a bench block: `entry` untimed entry steps from a clean
    start, then `steps` timed ones, per index the slowest rank's clock advance (as the bench)."""
    from caramel.bench.step_metrics import job_step_times
    ends = [[0.0] * (entry + steps) for _ in range(n)]
    for e in result.trace.events:
        if e.kind == "step" and e.iteration < entry + steps:
            ends[e.rank][e.iteration] = e.end_s
    rank_times = [[ends[w][k] - ends[w][k - 1] for k in range(entry, entry + steps)] for w in range(n)]
    return job_step_times(rank_times)


def replay(sim: types.ModuleType, prof, cluster, options, entry: int, steps: int) -> dict:
    """The steady prediction's terms and the block's step times from one simulator copy."""
    res = sim.simulate_ps(prof, cluster, options, 4)  # the bench's call: the recorded prediction
    unrolled = sim.simulate_ps(prof, cluster, options, entry + steps + 1)
    m = res.meta
    slow = m["periods_s"].index(max(m["periods_s"]))
    block = block_times_s(unrolled, cluster.world_size, entry, steps)
    return {"steady_s": res.step_time_s, "period_s": max(m["periods_s"]), "slowest_rank": slow,
            "pieces_s": m["pieces_s"], "bound": res.critical_path["bound"], **m["bound_terms"],
            "block_s": block, "block_median_s": statistics.median(block), "block_mean_s": statistics.mean(block)}


def rows(path: str, sims: dict[str, types.ModuleType]) -> list[dict]:
    from caramel.bench.record import Record, config_label
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies import STRATEGIES
    from caramel.topology.spec import ClusterSpec

    with open(path) as f:
        d = json.load(f)
    if not (d.get("meta") or {}).get("prediction_inputs"):
        raise SystemExit(f"ps_ssp_terms: {path} has no meta.prediction_inputs (nothing to replay)")
    steps = int(d["meta"]["settings"]["steps_per_round"])
    fields = set(Record.__dataclass_fields__)
    out = []
    for label, pi in d["meta"]["prediction_inputs"].items():
        prof = ModelProfile.from_dict(pi["profile"])
        base = ClusterSpec.from_dict(copy.deepcopy(pi["clusters"]["base"]))
        for r in d["records"]:
            if r["strategy"].split(":", 1)[0] != "ps" or "asp" in r["strategy"]:
                continue
            if config_label(Record(**{k: v for k, v in r.items() if k in fields})) != label:
                continue
            options = STRATEGIES.spec(r["strategy"]).options
            bound = options.staleness_bound()
            entry = bound + 1 if bound > 0 else 1  # `caramel.bench.strategies.steady_entry`
            # the same transfers at the comm-only baseline's rate: every probed efficiency 1
            ideal = copy.deepcopy(base)
            ideal.meta = {k: v for k, v in ideal.meta.items() if "efficiency" not in k}
            row = {"run": os.path.normpath(path), "code": d["meta"].get("code"), "config": label,
                   "strategy": r["strategy"], "bound": bound, "entry_steps": entry, "steps_per_round": steps,
                   "rate_bps": base.bandwidth_bps,
                   "measured_median_s": r["step_time_median_s"], "measured_mean_s": r["step_time_mean_s"],
                   "round_medians_s": r["round_medians_s"], "measured_comm_only_s": r["comm_s"],
                   "measured_compute_s": r["compute_s"], "recorded_prediction_s": r["predicted_step_s"]}
            for key, sim in sims.items():
                row[key] = replay(sim, prof, base, options, entry, steps)
            row["link_rate"] = replay(sims["model"], prof, ideal, options, entry, steps)
            row["early_apply_link_rate"] = replay(sims["early_apply"], prof, ideal, options, entry, steps)
            out.append(row)
    return out


def print_rows(all_rows: list[dict]) -> None:
    ms = lambda s: f"{1e3 * s:.1f}"  # noqa: E731
    for x in all_rows:
        m, mo = x["measured_median_s"], x["model"]
        pct = lambda s: f"{100 * (s / m - 1):+.1f}%"  # noqa: E731
        p = mo["pieces_s"]
        print(f"{x['run']} | {x['strategy']} | {x['config']} (code {x['code']})")
        print(f"  measured median {ms(m)} (mean {ms(x['measured_mean_s'])}); comm-only baseline {ms(x['measured_comm_only_s'])}"
              f", compute {ms(x['measured_compute_s'])}; recorded prediction {ms(x['recorded_prediction_s'])} {pct(x['recorded_prediction_s'])}")
        for key, label in (("model", "model"), ("early_apply", "what-if early apply"), ("link_rate", "model at link rate"),
                           ("early_apply_link_rate", "both")):
            t = x[key]
            print(f"  {label:>20}: steady {ms(t['steady_s'])} {pct(t['steady_s'])} = max(period {ms(t['period_s'])}, "
                  f"bound {ms(t['group_s'])} [{t['bound']}]; pulls of one server {'/'.join(ms(s) for s in t['pulls_of_s'])},"
                  f" pushes to one {'/'.join(ms(s) for s in t['pushes_to_s'])}); block median {ms(t['block_median_s'])} "
                  f"{pct(t['block_median_s'])} mean {ms(t['block_mean_s'])}")
        print(f"  model's period pieces (rank {mo['slowest_rank']}): forward {ms(p['forward'])} (pull wait "
              f"{ms(p['forward_wait'])}), backward {ms(p['backward'])}, step() {ms(p['optimizer_step'])}")
        print("  model block ms: " + " ".join(ms(t) for t in mo["block_s"])
              + " | what-if: " + " ".join(ms(t) for t in x["early_apply"]["block_s"])
              + " | measured round medians: " + " ".join(ms(t) for t in x["round_medians_s"]))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json", nargs="+")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    sims = {"model": load_simulator(False), "early_apply": load_simulator(True)}
    all_rows = [x for path in args.bench_json for x in rows(path, sims)]
    print_rows(all_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": "caramel.ps_ssp_terms/1", "rows": all_rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
