"""Where the ps simulator's bsp errors come from, term by term, from stored records only.

Two kinds of stored record, each printed as predicted against measured per term (ms):

- `caramel.ps-breakdown/1` (`experiments/ps_breakdown.py`): every rank's event times in a
  step (each bucket handed over, each push or receive waited, the used count in, the pulls
  issued, rank 0's buffers in) beside the model's replay in the same job (`model.timeline_ms`).
  Terms: the forward's compute, the pull phase (from the step's start to the last rank's buffers,
  which leave after the pulls), the backward, the push phase (the last rank's last hand-over to
  the last push or receive waited), the tail (to the pulls issued), and the patterns alone:
  the plan's pushes alone and pulls alone (rank 0's own time) against the traffic probe's
  all-at-once reading (the slowest rank's) and against the model's; then each push bucket in
  the step: handed over, landed at its server, against its copies alone at the rate and the
  model's span.
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


def breakdown_pushes(d: dict) -> list[tuple[int, int, float, float, float, float]]:
    """Per push bucket of a ps-breakdown record, in push order: (bucket, server, the first and
    the last rank's hand-over, the server's last receive waited, the model's push span), ms into
    the step. A rank's works are its pushes in bucket order: (n - 1) receives for a bucket it
    serves, one send for each other; a work's time is when its wait returned (waits run in
    order, after `step()` is called: an upper bound on its completion)."""
    m, p = d["model"], d["ps"]
    ranks, owners = p["timeline_ms_per_rank"], p["bucket_owner"]
    n = len(ranks)
    model = {b: z - a for b, _, a, z in m["timeline_ms"]["pushes"]}
    out = []
    for b, o in enumerate(owners):
        j = sum(n - 1 if owners[c] == o else 1 for c in range(b))  # the server's first work for b
        landed = max(ranks[o][f"work_{j + k}_waited"] for k in range(n - 1))
        handed = [r[f"handed_{b}"] for r in ranks]
        out.append((b, o, min(handed), max(handed), landed, model[b]))
    return out


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
            m = d["model"]
            print(f"    each push, in push order (ms into the step; the model at push efficiency "
                  f"{m['push_efficiency']:.3f}; one bucket's copies alone at the rate: (n - 1) x bytes / rate)")
            print(f"    {'bucket':>6} {'server':>6} {'handed first':>12} {'last':>6} {'landed':>7} {'took':>10} "
                  f"{'alone at rate':>13} {'model took':>10}")
            for (b, o, h0, h1, z, mod), nb in zip(breakdown_pushes(d), d["ps"]["bucket_bytes"]):
                alone = 1e3 * (n - 1) * nb * 8 / m["rate_bps"]
                print(f"    {b:>6} {o:>6} {h0:12.1f} {h1:6.1f} {z:7.1f} {z - h1:4.1f}-{z - h0:4.1f} {alone:13.1f} {mod:10.1f}")
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
