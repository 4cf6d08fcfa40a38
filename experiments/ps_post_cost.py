"""What posting a colocated server's receives at the step's first gradient costs inside the
backward (`PsEngine._expect_pushes`, on gloo), against the backward it sits in.

The posting runs in the first post-accumulate hook, so the later gradients' ready times, and
the backward the profiling steps time, include it. Untimed diagnostic on the loopback (no
emulated link): the posting is local work (allocating the buffers, handing the receives to
gloo), so the link does not enter it.

    for spec in ps ps:bucket_cap_mb=0; do
        torchrun --nproc-per-node 4 experiments/ps_post_cost.py --spec $spec --json OUT --label 1
    done

With `--json OUT` rank 0 gathers every rank's row and adds them to run `--run` of OUT (created
if missing; a spec already in that run is replaced), with the host load before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import caramel
from caramel.jsonio import format_tag, read_json, write_json
from caramel.models import get_model
from caramel.strategies.ps.engine import PsEngine

def measure(spec: str, steps: int, warmup: int) -> dict:
    """Per step: the posting's time, how many receives it posted, and the backward's time."""
    posting_s: list[float] = []
    posted: list[int] = []
    real = PsEngine._expect_pushes

    def timed(engine, u):
        before = len(u.works)
        t0 = time.perf_counter()
        real(engine, u)
        posting_s.append(time.perf_counter() - t0)
        posted.append(len(u.works) - before)

    w = get_model("resnet18")(batch_size=8, seed=0, width=16)
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    model, opt = caramel.parallelize(w.model, opt, spec)
    rank, workers = dist.get_rank(), dist.get_world_size()
    backward_s = []
    PsEngine._expect_pushes = timed
    try:
        for step in range(steps):
            b = get_model("resnet18")(batch_size=8, seed=1 + step * workers + rank, width=16)
            loss = w.loss_fn(model(b.inputs), b.targets)
            t0 = time.perf_counter()
            loss.backward()
            backward_s.append(time.perf_counter() - t0)
            opt.step()
            opt.zero_grad()
        opt.synchronize()
    finally:
        PsEngine._expect_pushes = real
    caramel.shutdown()
    keep = slice(warmup, None)
    return {"spec": spec, "rank": rank, "steps_kept": steps - warmup,
            "posting_ms_median": statistics.median(posting_s[keep]) * 1e3 if posting_s[keep] else None,
            "posting_ms_max": max(posting_s[keep]) * 1e3 if posting_s[keep] else None,
            "receives_per_step": statistics.median(posted[keep]) if posted[keep] else 0,
            "backward_ms_median": statistics.median(backward_s[keep]) * 1e3}


KIND = "ps-post-cost"
WHAT = ("a colocated gloo server's receive posting (PsEngine._expect_pushes) at the step's first "
        "gradient, timed inside the backward; loopback, resnet18 width 16, batch 8, SGD momentum; "
        "untimed diagnostic (no bench lock): medians per rank")


def load_line(when: str) -> str:
    """The host's 1, 5 and 15 minute load averages, as the stored runs record them."""
    return f"load_{when} " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def add_rows(data: dict | None, run: str, rows: list[dict], loads: list[str], command: str) -> dict:
    """`data` (a ps-post-cost file, or None for a new one) with `rows` in run `run`: rows of a
    spec already there are replaced, the loads appended; the runs stay in their order."""
    if data is None:
        data = {"format": format_tag(KIND), "what": WHAT, "command": command, "runs": []}
    specs = {r["spec"] for r in rows}
    for entry in data["runs"]:
        if entry["run"] == run:
            entry["rows"] = [r for r in entry["rows"] if r["spec"] not in specs] + rows
            entry["loads"] = entry["loads"] + loads
            return data
    data["runs"].append({"run": run, "loads": loads, "rows": rows})
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="ps", help="a colocated ps spec, e.g. ps:bucket_cap_mb=0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="add the rows to this results file (rank 0 writes)")
    ap.add_argument("--label", default="1", help="the run label the rows go under in --json")
    args = ap.parse_args()
    if not args.spec.startswith("ps"):
        ap.error(f"--spec: expected a ps spec, got {args.spec!r}")
    if not 0 <= args.warmup < args.steps:
        ap.error(f"expected 0 <= --warmup < --steps, got {args.warmup} and {args.steps}")
    before = load_line("before")
    caramel.init_distributed()
    row = measure(args.spec, args.steps, args.warmup)
    print(json.dumps(row), flush=True)  # one line per rank
    if args.json is None:
        return
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        old = read_json(args.json, KIND) if args.json.exists() else None
        command = f"torchrun --nproc-per-node {len(rows)} experiments/ps_post_cost.py --spec SPEC --json OUT --label N"
        write_json(args.json, add_rows(old, args.label, rows, [before, load_line("after")], command))


if __name__ == "__main__":
    main()
