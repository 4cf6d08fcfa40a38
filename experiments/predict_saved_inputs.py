"""Every strategy's prediction again from a bench run's saved inputs, with this tree's models.

`caramel bench --trace DIR` keeps, per configuration, what its predictions were made from
(`trace/<NN-config>/prediction_inputs.json`: the profile, each rank's compute-only median, the
concurrent baseline's spans, the link probe; since the bench saves them, the ps traffic probe,
each strategy's name as predicted and the configuration's label). This predicts each of that
configuration's records in the run's `bench.json` from them (`job_predictions`, then
`predictions_by_name`, as the bench does) and prints it beside the recorded prediction and the
measured median. Run it from two trees (PYTHONPATH) to see which rows a model change moves:
data parallelism's must not move when only the pipeline's does.

Inputs saved before the traffic probe and the screened names were kept cannot be replayed as the
bench did for every strategy: a ps or gossip strategy (which read the traffic probe) and a tuned
one (predicted as its screened value) are then printed "not replayable" with the reason, never
predicted otherwise; so is a ps:hierarchical=true row whose inputs lack the layout (ranks per host,
saved since several ranks per host could run). A trace directory is paired with its records by the saved label or, in older
runs, by its name (model, workers, link) and uneven workers; one that matches no configuration or
several is an error. The inputs do not say which runtime ran: the GPT-2 pipelines of
pipeline_contention runs B, E and E2 never summed their tied weight's gradient, which this tree
prices (docs/results/pipeline_replay_all.md).

    PYTHONPATH=. python experiments/predict_saved_inputs.py docs/results/pipeline_profile_turns/run_m
"""
from __future__ import annotations

import glob
import json
import os
import sys

from caramel.bench.cli import trace_config_name
from caramel.strategies.options import parse_spec

TRAFFIC_KINDS = ("ps", "gossip")  # the strategies whose models read the traffic probe (`caramel.bench.prediction`)


class RunError(Exception):
    """A run directory this cannot replay; the message names it and what is expected."""


def _load(path: str):
    with open(path) as f:
        return json.load(f)


def _dir_name(r: dict) -> str:
    """The trace directory name the bench gives a record's configuration, less its index."""
    return trace_config_name(r["model"], r["workers"], r.get("bandwidth"))


def _signature(r: dict) -> str:
    """What tells one configuration's records from another's."""
    keys = ("model", "model_options", "batch_size", "workers", "bandwidth", "target_ratio", "slow_worker",
            "slow_link", "jitter")
    return json.dumps({k: r.get(k) for k in keys}, sort_keys=True)


def config_records(path: str, inputs: dict, records: list[dict]) -> list[dict]:
    """The records of the configuration whose inputs `path` holds."""
    from caramel.bench.record import Record, config_label

    if inputs.get("config"):
        fields = set(Record.__dataclass_fields__)
        mine = [r for r in records if config_label(Record(**{k: v for k, v in r.items() if k in fields}))
                == inputs["config"]]
    else:
        name = os.path.basename(os.path.dirname(path)).split("-", 1)[-1]
        mine = [r for r in records if _dir_name(r) == name]
        uneven = inputs.get("heterogeneity") or {}
        mine = [r for r in mine if all(r.get(k) == uneven.get(k) for k in ("slow_worker", "slow_link", "jitter"))]
    if len({_signature(r) for r in mine}) != 1:
        raise RunError(f"{path}: matches {len({_signature(r) for r in mine})} configurations of bench.json, "
                       f"expected exactly one")
    return mine


def not_replayable(r: dict, inputs: dict) -> str | None:
    """Why the bench's prediction of record `r` cannot be made again from `inputs`, or None."""
    if r.get("tuning") and "screened" not in inputs:
        return "tuned, and the inputs lack the screened names"
    if r["strategy"].split(":", 1)[0] in TRAFFIC_KINDS and "traffic" not in inputs:
        return "its model reads the ps traffic probe, which the inputs lack"
    name, options = parse_spec(r["strategy"])
    if name == "ps" and options.get("hierarchical") is True and not inputs.get("layout"):
        # the hierarchical model reads ranks per host from the layout (`caramel.strategies.ps.sim_meta`)
        return "hierarchical, and the inputs lack the layout"
    return None


def predict_run(run: str, sharing_model: str | None = None) -> list[dict]:
    """Every record of `run` predicted again from its saved inputs. `sharing_model` (one of
    `caramel.topology.spec.SHARING_MODELS`): the pipeline simulator's host-sharing model to
    replay with where the profile measured host sharing (None: the one the profile names, "layout"
    where it names none, as every run before the per-stage model)."""
    from caramel.bench.hetero_prediction import Heterogeneity
    from caramel.bench.prediction import job_predictions
    from caramel.bench.screening import predictions_by_name
    from caramel.profile.model_profile import ModelProfile
    from caramel.topology.spec import SHARING_MODELS

    if sharing_model is not None and sharing_model not in SHARING_MODELS:
        raise RunError(f"predict_run: sharing_model must be one of {', '.join(SHARING_MODELS)} or None (the "
                       f"profile's own), got {sharing_model!r}")

    bench_path = os.path.join(run, "bench.json")
    paths = sorted(glob.glob(os.path.join(run, "trace", "*", "prediction_inputs.json")))
    if not os.path.isfile(bench_path) or not paths:
        raise RunError(f"{run}: expected bench.json and trace/*/prediction_inputs.json (from `caramel bench --trace "
                       f"DIR --json DIR/bench.json`), found {'bench.json' if os.path.isfile(bench_path) else 'no bench.json'}"
                       f" and {len(paths)} prediction_inputs.json")
    records = [r for r in _load(bench_path)["records"]
               if r.get("predicted_step_s") is not None or r.get("step_time_median_s")]
    rows = []
    for path in paths:
        d = _load(path)
        shared = (d["profile"].get("meta") or {}).get("host_sharing")
        if sharing_model is not None and shared:  # a copy: the loaded inputs stay as stored
            meta = {**d["profile"]["meta"], "host_sharing": {**shared, "model": sharing_model}}
            d["profile"] = {**d["profile"], "meta": meta}
        mine = config_records(path, d, records)
        why = {r["strategy"]: not_replayable(r, d) for r in mine}
        screened = {n: (d.get("screened") or {}).get(n, n) for n, w in why.items() if w is None}
        out = job_predictions(ModelProfile.from_dict(d["profile"]), list(dict.fromkeys(screened.values())), d["world"],
                              d["grad_bytes"], d["comm_s"], d["comm_buckets"], d["rank_compute_s"], d["spans"],
                              d["probed"], d.get("traffic"), Heterogeneity.from_dict(d.get("heterogeneity")),
                              layout=d.get("layout"))
        out = predictions_by_name(out, screened)["predicted"]
        for r in mine:
            p = out.get(r["strategy"], {}).get("step_time_s")
            rows.append({"run": run, "config": os.path.basename(os.path.dirname(path)), "strategy": r["strategy"],
                         "measured_s": r.get("step_time_median_s"), "recorded_s": r.get("predicted_step_s"),
                         "predicted_s": p, "not_replayable": why[r["strategy"]]})
    return rows


def _ms(value: float | None) -> str:
    return f"{1e3 * value:.1f}" if value else "-"


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: predict_saved_inputs.py RUN_DIR...", file=sys.stderr)
        return 2
    for run in argv:
        try:
            rows = predict_run(run)
        except RunError as e:
            print(f"predict_saved_inputs: {e}", file=sys.stderr)
            return 2
        configs = len({r["config"] for r in rows})
        for r in rows:
            m, rec, p = r["measured_s"], r["recorded_s"], r["predicted_s"]
            where = f"{run}{'/' + r['config'] if configs > 1 else ''}"
            if r["not_replayable"]:
                print(f"{where}: {r['strategy']}: measured {_ms(m)} ms, recorded {_ms(rec)}, not replayable "
                      f"({r['not_replayable']})")
                continue
            err = f"{100 * (p / m - 1):+.1f}%" if p and m else "-"
            print(f"{where}: {r['strategy']}: measured {_ms(m)} ms, recorded {_ms(rec)}, this tree {_ms(p)} ({err})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
