"""Where torch DDP's step goes on the emulated cluster: forward overhead, bucket timing.

The bench's DDP model predicts DDP 20-30% below its measured step. This times what the model
leaves out, on 2 workers (run under `caramel cluster run`):

- the forward: plain (no DDP), DDP with `broadcast_buffers=False`, DDP with the default
  `broadcast_buffers=True`, and one broadcast of the model's buffers alone;
- each gradient bucket's all-reduce, through a comm hook: when it is launched and when it
  completes, relative to the start of backward; the backward (with DDP's final wait) and the step.

    caramel cluster run --workers 2 --bandwidth 300mbit -- \\
        python experiments/ddp_breakdown.py --json docs/results/ddp_breakdown.json
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from experiments.cluster_job import join, median_ms, model_arguments, report, workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, steps=20)
    args = ap.parse_args()
    join()

    def fresh():
        return workload(args)

    med = median_ms
    out: dict = {"format": "caramel.ddp-breakdown/1", "model": args.model, "width": args.width,
                 "batch_size": args.batch_size, "steps": args.steps, "torch": torch.__version__}
    w = fresh()
    plain = []
    for _ in range(args.steps):
        t = time.perf_counter()
        w.loss_fn(w.model(w.inputs), w.targets)
        plain.append(time.perf_counter() - t)
    out["plain_forward_ms"] = med(plain[3:])
    for bb in (False, True):
        w = fresh()
        ddp = nn.parallel.DistributedDataParallel(w.model, broadcast_buffers=bb)
        log: list[tuple[float, float, int]] = []

        def hook(_state, bucket, log=log):
            t0, nbytes = time.perf_counter(), bucket.buffer().numel() * bucket.buffer().element_size()
            fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

            def done(f):
                log.append((t0, time.perf_counter(), nbytes))
                return f.value()[0]
            return fut.then(done)
        ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        rows = []
        for step in range(args.steps):
            dist.barrier()
            log.clear()
            t0 = time.perf_counter()
            loss = w.loss_fn(ddp(w.inputs), w.targets)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad()
            t3 = time.perf_counter()
            if step >= 5:
                rows.append((t1 - t0, t2 - t1, t3 - t0, [(a - t1, b - t1, n) for a, b, n in sorted(log)]))
        key = "ddp_broadcast_buffers" if bb else "ddp_no_buffer_broadcast"
        out[key] = {"forward_ms": med([r[0] for r in rows]), "backward_with_wait_ms": med([r[1] for r in rows]),
                    "step_ms": med([r[2] for r in rows]),
                    "buckets": [{"mb": rows[0][3][k][2] / 1e6,
                                 "launched_ms_after_backward_start": med([r[3][k][0] for r in rows]),
                                 "done_ms_after_backward_start": med([r[3][k][1] for r in rows])}
                                for k in range(len(rows[0][3]))]}
    nbytes = sum(b.numel() * b.element_size() for b in w.model.buffers())
    buf, bt = torch.zeros(max(1, nbytes // 4)), []
    for _ in range(args.steps):
        dist.barrier()
        t = time.perf_counter()
        dist.broadcast(buf, 0)
        bt.append(time.perf_counter() - t)
    out["buffer_bytes"], out["buffer_broadcast_alone_ms"] = nbytes, med(bt)
    report(out, args.json)


if __name__ == "__main__":
    main()
