"""What posting a colocated server's receives at the step's first gradient costs inside the
backward (`PsEngine._expect_pushes`, on gloo), against the backward it sits in.

The posting runs in the first post-accumulate hook, so the later gradients' ready times, and
the backward the profiling steps time, include it. Untimed diagnostic on the loopback (no
emulated link): the posting is local work (allocating the buffers, handing the receives to
gloo), so the link does not enter it.

    torchrun --nproc-per-node 4 experiments/ps_post_cost.py --spec ps:bucket_cap_mb=0
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import caramel
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="ps", help="a colocated ps spec, e.g. ps:bucket_cap_mb=0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if not args.spec.startswith("ps"):
        ap.error(f"--spec: expected a ps spec, got {args.spec!r}")
    if not 0 <= args.warmup < args.steps:
        ap.error(f"expected 0 <= --warmup < --steps, got {args.warmup} and {args.steps}")
    caramel.init_distributed()
    print(json.dumps(measure(args.spec, args.steps, args.warmup)), flush=True)  # one line per rank


if __name__ == "__main__":
    main()
