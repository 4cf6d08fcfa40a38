"""What deferring weight gradients could gain on the bench's models, by simulation (issue:
computation scheduling), not a unit test.

    python -m experiments.deferral_screen [--json OUT]

Profiles each bench model offline (`profile_model`, with its split steps: every splittable
layer's weight-gradient time measured apart), then at comm/compute 0.5, 1 and 2 on 2 workers
(the link rate derived from the profile, as the bench derives it) plans with the `caramel`
planner for k = 0 and for every k forced up to all splittable layers, and reports each
prediction beside k = 0, the memory each k keeps alive over the 10% cap, and what `auto` picks.
"""
from __future__ import annotations

import argparse

import torch

from caramel.jsonio import format_tag, write_json
from caramel.models import get_model
from caramel.plan import compute_schedule as cs
from caramel.profile.profiler import profile_model
from caramel.strategies.caramel.planner import plan_caramel
from caramel.topology.spec import ClusterSpec

MODELS = [("resnet18", 8, {"width": 16}), ("gpt2", 2, {})]  # docs/benchmarks.md's points
RATIOS = (0.5, 1.0, 2.0)


def ks_for(n: int) -> list[int]:
    return sorted({k for k in (1, 2, 4, 8, n // 2, n) if 1 <= k <= n})


def screen(name: str, batch: int, options: dict) -> list[dict]:
    w = get_model(name)(batch_size=batch, **options)
    prof = profile_model(w.model, w.inputs, w.targets, w.loss_fn, steps=5)
    n = len(cs.deferrable_modules(prof))
    cap = cs.memory_cap_bytes(prof)
    grad, compute_s = prof.total_grad_bytes(), prof.compute_time_s
    rows = []
    for ratio in RATIOS:
        # 2 workers: a ring all-reduce moves the gradient's bytes once over each link
        cluster = ClusterSpec.uniform(2, 8 * grad / (ratio * compute_s), 100e-6)
        off = plan_caramel(prof, cluster, world_size=2, compute_schedule="off", input_spread=0).predicted_step_time_s
        auto = plan_caramel(prof, cluster, world_size=2, compute_schedule="auto", input_spread=0)
        row = {"model": name, "comm_compute": ratio, "compute_s": compute_s, "off_step_s": off,
               "auto_k": auto.options["compute_schedule"]["chosen"], "k_max_within_cap": cs.max_k(prof),
               "cap_bytes": cap, "forced": []}
        for k in ks_for(n):
            p = plan_caramel(prof, cluster, world_size=2, compute_schedule=k, input_spread=0)
            extra = p.compute_schedule.extra_bytes if p.compute_schedule else 0
            row["forced"].append({"k": k, "step_s": p.predicted_step_time_s, "gain": off / p.predicted_step_time_s - 1,
                                  "extra_bytes": extra, "over_cap": extra > cap})
        rows.append(row)
        best = max(row["forced"], key=lambda f: f["gain"])
        print(f"{name:9s} r={ratio}: off {off * 1e3:.1f} ms; auto k={row['auto_k']} (k<= {row['k_max_within_cap']} "
              f"within the cap); best forced k={best['k']} {best['gain'] * 100:+.1f}%"
              f"{' (over the cap)' if best['over_cap'] else ''}; "
              + ", ".join(f"k{f['k']} {f['gain'] * 100:+.1f}%" for f in row["forced"]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [r for name, batch, opts in MODELS for r in screen(name, batch, opts)]
    if args.json:
        write_json(args.json, {"format": format_tag("deferral_screen"), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
