"""Where the ps simulator's bsp errors come from, term by term, from stored records only.

Two kinds of stored record, each printed as predicted against measured per term (ms):

- `caramel.ps-breakdown/1` (`experiments/ps_breakdown.py`): every rank's event times in a
  step (each bucket handed over, each push or receive waited, the used count in, the pulls
  issued, rank 0's buffers in) beside the model's replay in the same job (`model.timeline_ms`).
  Terms: the forward's compute, the pull phase (from the step's start to the last rank's buffers,
  which leave after the pulls), the backward, the push phase (the last rank's last hand-over to
  the last push or receive waited), the tail (to the pulls issued), and the patterns alone:
  the plan's pushes alone and pulls alone against the traffic probe's all-at-once reading and
  against the model's one-push / one-pull time.
- bench JSONs with `meta.prediction_inputs`: every bsp ps row replayed (`simulate_ps`), its
  step split into the model's pull phase, compute and push phase (`meta.timeline_s`), the
  probe's pattern times and the ideal at the comm-only baseline's rate, and the measured step;
  `link need` is what the two transfer phases would have to take for the model to hit the
  measured step with every other term as modelled (measured - (predicted - both phases)).

Nothing is fitted, nothing changed: it prints.

    PYTHONPATH=. python experiments/ps_sim_bsp_terms.py docs/results/ps_breakdown_queues_503x4.json \
        docs/results/ps_order_final.json docs/results/ps_sim_links_fresh/w4/bench.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def breakdown_terms(d: dict) -> list[tuple[str, float, float]]:
    """(term, predicted ms, measured ms) of one ps-breakdown record (bsp, colocated)."""
    m, p = d["model"], d["ps"]
    tl, ranks = m["timeline_ms"], p["timeline_ms_per_rank"]
    last = lambda key: max(r[key] for r in ranks)  # noqa: E731
    handed = [k for k in ranks[0] if k.startswith("handed_")]
    works = [k for k in ranks[0] if k.startswith("work_")]
    model_pull_end = max(e for *_, e in tl["pulls_before"])
    model_push_start = max(max(h) for h in tl["handed"])
    model_push_end = max(e for *_, e in tl["pushes"])
    meas_push_start = max(max(r[k] for k in handed) for r in ranks)
    meas_push_end = max(max(r[k] for k in works) for r in ranks)
    n = len(ranks)
    sizes = p["bucket_bytes"]
    rate_Bps = m["rate_bps"] / 8
    owners = p["bucket_owner"]
    plan_ideal = max((n - 1) * sum(s for s, o in zip(sizes, owners) if o == x) for x in set(owners)) / rate_Bps * 1e3
    tr = m["traffic"]
    ideal = (n - 1) * tr["all_to_all_bytes"] / rate_Bps * 1e3

    def model_ms(kind: str) -> float:  # the busiest server's buckets at the probe's rate for the pattern
        return 1e3 * max(sum(m["latency_s"] + (n - 1) * s / (m[f"{kind}_efficiency"] * rate_Bps)
                             for s, o in zip(sizes, owners) if o == x) for x in set(owners))
    return [
        ("step", m["step_ms"], p["step_ms"]),
        ("forward, compute (less its waits)", m["forward_ms"] - m["forward_wait_ms"],
         p["forward_ms"] - p["forward_wait_ms"] - p["forward_buffer_broadcast_ms"]),
        ("pull phase: step start to the last rank's pulls (model) / buffers (measured)", model_pull_end, last("buffers_end")),
        ("backward", m["backward_ms"], p["backward_ms"]),
        ("last hand-over (into the step)", model_push_start, meas_push_start),
        ("push phase: last hand-over to the last push landed", model_push_end - model_push_start,
         meas_push_end - meas_push_start),
        ("tail: last push to the pulls issued (used count, apply)", m["step_ms"] - model_push_end,
         last("pulls_issued") - meas_push_end),
        ("pushes alone: model (busiest server) / the plan's pushes alone", model_ms("push"), p["pushes_alone_ms"]),
        ("  the plan's pushes or pulls alone at the rate (the busiest server's NIC)", plan_ideal, plan_ideal),
        ("  the probe's all-to-all (slowest rank's own time) / ideal at the rate", tr["all_to_all_s"] * 1e3, ideal),
        ("pulls alone: model (busiest server) / the plan's pulls alone", model_ms("pull"), p["pulls_alone_ms"]),
        ("  the probe's broadcasts (slowest rank's own time) / ideal at the rate", tr["broadcasts_s"] * 1e3, ideal),
    ]


def bench_terms(d: dict) -> list[dict]:
    """One dict per bsp ps row of a bench run with saved inputs: the model's phases, the probe's
    pattern times, the measured step."""
    from caramel.bench.record import Record, config_label
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies import STRATEGIES
    from caramel.topology.spec import ClusterSpec

    fields = set(Record.__dataclass_fields__)
    out = []
    for label, pi in d["meta"]["prediction_inputs"].items():
        prof = ModelProfile.from_dict(pi["profile"])
        cluster = ClusterSpec.from_dict(pi["clusters"]["base"])
        for r in d["records"]:
            if r["strategy"].split(":", 1)[0] != "ps" or "consistency" in r["strategy"]:
                continue
            if config_label(Record(**{k: v for k, v in r.items() if k in fields})) != label:
                continue
            sim = STRATEGIES.spec(r["strategy"]).simulate(prof, cluster, 4)  # as `predict` does
            tl = sim.meta["timeline_s"]
            pull_phase = max((e for *_, e in tl["pulls_before"]), default=0.0)
            push_start = max(max(h) for h in tl["handed"])
            push_phase = max(e for *_, e in tl["pushes"]) - push_start
            n = cluster.world_size
            tr = (r.get("link_fit") or {}).get("traffic_probe") or {}
            shard = tr.get("all_to_all_bytes")
            ideal = (n - 1) * shard * 8 / cluster.bandwidth_bps if shard else None
            pieces = sim.meta["pieces_s"]
            out.append({
                "config": label, "strategy": r["strategy"], "measured": r["step_time_median_s"], "predicted": sim.step_time_s,
                "compute_alone": r["compute_s"], "model_compute": pieces["forward"] - pieces["forward_wait"] + pieces["backward"],
                "pull_phase": pull_phase, "push_phase": push_phase, "probe_a2a": tr.get("all_to_all_s"),
                "probe_bcast": tr.get("broadcasts_s"), "ideal": ideal,
                "push_eff": cluster.meta.get("push_efficiency"), "pull_eff": cluster.meta.get("pull_efficiency"),
                "slowdown": cluster.compute_slowdown})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", help="ps-breakdown JSONs and bench JSONs with meta.prediction_inputs")
    args = ap.parse_args(argv)
    ms = lambda x: "-" if x is None else f"{1e3 * x:.1f}"  # noqa: E731
    for path in args.records:
        with open(path) as f:
            d = json.load(f)
        if d.get("format") == "caramel.ps-breakdown/1":
            if not isinstance(d.get("model"), dict) or "timeline_ms" not in d["model"]:
                print(f"{path}: a ps-breakdown record without the model's timeline (skipped)\n")
                continue
            n = len(d["ps"]["timeline_ms_per_rank"])
            print(f"{path}: {n} workers at {float(d['bandwidth_bps']) / 1e6:.0f} Mbit/s, probe efficiencies push "
                  f"{d['model']['push_efficiency']:.3f} pull {d['model']['pull_efficiency']:.3f}")
            print(f"    {'term':<78} {'model':>7} {'measured':>8} {'diff':>7}")
            for name, a, b in breakdown_terms(d):
                print(f"    {name:<78} {a:7.1f} {b:8.1f} {a - b:+7.1f}")
            print()
            continue
        if not (d.get("meta") or {}).get("prediction_inputs"):
            print(f"ps_sim_bsp_terms: {path} is neither a ps-breakdown record nor a bench JSON with "
                  f"meta.prediction_inputs", file=sys.stderr)
            return 2
        rows = bench_terms(d)
        print(f"{path}: bsp ps rows (ms; phases from the model's steady step)")
        print(f"    {'configuration':<38} {'strategy':<18} {'meas':>6} {'pred':>6} {'err':>6} {'pull':>6} {'push':>6} "
              f"{'need':>6} {'a2a':>6} {'bcast':>6} {'ideal':>6} {'eff push/pull':>13}")
        for r in rows:
            need = r["measured"] - (r["predicted"] - r["pull_phase"] - r["push_phase"])
            eff = "-" if r["push_eff"] is None else f"{r['push_eff']:.2f}/{r['pull_eff']:.2f}"
            print(f"    {r['config']:<38} {r['strategy']:<18} {ms(r['measured']):>6} {ms(r['predicted']):>6} "
                  f"{100 * (r['predicted'] / r['measured'] - 1):+5.1f}% {ms(r['pull_phase']):>6} {ms(r['push_phase']):>6} "
                  f"{ms(need):>6} {ms(r['probe_a2a']):>6} {ms(r['probe_bcast']):>6} {ms(r['ideal']):>6} {eff:>13}")
        if rows:
            errs = [r["predicted"] / r["measured"] - 1 for r in rows]
            print(f"    median error {100 * statistics.median(errs):+.1f}%")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
