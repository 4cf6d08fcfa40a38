"""The ps model's predictions from a bench JSON's saved inputs, one input changed at a time.

A bench result keeps, per configuration, what its predictions were made from
(`meta.prediction_inputs`: the profile and the "base" cluster, with the probe's fixed costs,
the contention factor and the ps traffic probe's `link_queue_s`, `push_efficiency`,
`pull_efficiency`). This replays every ps row from them (the recorded inputs reproduce the
recorded predictions exactly: checked, an error names any row that does not) and again with one input changed, to see which input, if any,
accounts for a row's error. Nothing here is fitted: it prints, it changes no model.
`--config LABEL` also prints a grid of push and pull efficiencies for that configuration only.

    PYTHONPATH=. python experiments/ps_sim_sensitivity.py docs/results/ps_order_final.json \
        --config 'resnet18(b=8,width=16) x4 @ 432mbit'
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys


def _meta(**kw):
    def f(cd):
        for k, v in kw.items():
            if v is None:
                cd["meta"].pop(k, None)
            else:
                cd["meta"][k] = v
    return f


def _top(**kw):
    return lambda cd: cd.update(kw)


def _unit_speeds(cd):
    for w in cd["workers"]:
        w["speed"] = 1.0


def _no_buffers(prof):
    m = {k: v for k, v in prof.meta.items() if k not in ("buffer_broadcasts", "buffer_bytes")}
    return dataclasses.replace(prof, meta=m)


CASES = [("recorded inputs", None, None),
         ("ps traffic probe's rates off (efficiency 1)", _meta(push_efficiency=None, pull_efficiency=None), None),
         ("link_queue_s 0", _meta(link_queue_s=None), None),
         ("compute_slowdown 1", _top(compute_slowdown=1.0), None),
         ("latency 0", _top(latency_s=0.0), None),
         ("no buffer broadcasts", None, _no_buffers),
         ("speeds 1 (the profile's pace, not each rank's)", _unit_speeds, None)]


def ps_errors(records, label, inputs, mod_cluster=None, mod_profile=None) -> list[tuple[str, float]]:
    """(strategy, predicted / measured - 1) of every ps record of configuration `label`."""
    return [(r["strategy"], e) for r, e in ps_rows(records, label, inputs, mod_cluster, mod_profile)]


def ps_rows(records, label, inputs, mod_cluster=None, mod_profile=None) -> list[tuple[dict, float]]:
    """Every ps row of configuration `label` in a bench run's `records`, replayed by the simulator
    from the run's saved `inputs` (cluster and profile, each optionally modified), with its error
    (predicted over measured, minus 1). Shared with `ps_sim_score`."""
    from caramel.bench.record import Record, config_label
    from caramel.errors import CaramelError
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict
    from caramel.topology.spec import ClusterSpec

    prof = ModelProfile.from_dict(inputs["profile"])
    cd = copy.deepcopy(inputs["clusters"]["base"])
    if mod_cluster:
        mod_cluster(cd)
    if mod_profile:
        prof = mod_profile(prof)
    cluster = ClusterSpec.from_dict(cd)
    fields = set(Record.__dataclass_fields__)
    out = []
    for r in records:
        if r["strategy"].split(":", 1)[0] != "ps":
            continue
        if config_label(Record(**{k: v for k, v in r.items() if k in fields})) != label:
            continue
        (p,) = predict(prof, cluster, [r["strategy"]])
        if p.step_time_s is None:  # `predict` keeps a simulator's error as the prediction's
            raise CaramelError(f"{r['strategy']}: no prediction: {p.error}")
        out.append((r, p.step_time_s / r["step_time_median_s"] - 1.0))
    return out


def replay_mismatches(d: dict, tol: float = 1e-9) -> list[str]:
    """The ps rows whose replay from the recorded inputs differs from their recorded
    `prediction_error`: every "one input changed" row is relative to that replay, so it must be
    the run's own prediction."""
    bad = []
    for label, pi in d["meta"]["prediction_inputs"].items():
        for r, e in ps_rows(d["records"], label, pi):
            rec = r.get("prediction_error")
            if rec is None or abs(e - rec) >= tol:
                bad.append(f"{label} {r['strategy']}: replayed {e:+.6f}, recorded {rec}")
    return bad


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json")
    ap.add_argument("--config", help="a configuration label of the run: also a grid of push/pull efficiencies")
    args = ap.parse_args(argv)
    with open(args.bench_json) as f:
        d = json.load(f)
    inputs = (d.get("meta") or {}).get("prediction_inputs")
    if not inputs:
        print(f"ps_sim_sensitivity: {args.bench_json} has no meta.prediction_inputs (a bench result from before "
              f"they were saved)", file=sys.stderr)
        return 2
    if args.config and args.config not in inputs:
        print(f"ps_sim_sensitivity: --config must be one of {sorted(inputs)}, got {args.config!r}", file=sys.stderr)
        return 2
    bad = replay_mismatches(d)
    if bad:
        print(f"ps_sim_sensitivity: {args.bench_json}: the recorded inputs do not reproduce the recorded "
              f"predictions (was the model changed since?):\n    " + "\n    ".join(bad), file=sys.stderr)
        return 1
    for name, mc, mp in CASES:
        cells = []
        for label, pi in inputs.items():
            errs = ps_errors(d["records"], label, pi, mc, mp)
            if errs:
                cells.append(f"{label}: " + "/".join(f"{100 * e:+.1f}%" for _, e in errs))
        print(f"{name}\n    " + "\n    ".join(cells))
    if args.config:
        pi = inputs[args.config]
        print(f"{args.config}: push x pull efficiency (recorded {pi['clusters']['base']['meta'].get('push_efficiency')}"
              f", {pi['clusters']['base']['meta'].get('pull_efficiency')})")
        meta = pi["clusters"]["base"]["meta"]
        # the recorded push and pull, then the readings of the other runs that carry the probe
        for push in (meta.get("push_efficiency", 1.0), 0.61, 0.70):
            for pull in (meta.get("pull_efficiency", 1.0), 0.640, 0.704, 0.731, 0.826, 1.0):
                errs = ps_errors(d["records"], args.config, pi, _meta(push_efficiency=push, pull_efficiency=pull))
                print(f"    push {push:.3f} pull {pull:.3f}: " + "/".join(f"{100 * e:+.1f}%" for _, e in errs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
