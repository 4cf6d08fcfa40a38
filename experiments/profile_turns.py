"""How much does profiling with every rank at once overstate a model's compute on a shared host?

Spawns `--ranks` processes (one compute thread each, as the bench's workers), each profiling the
same zoo model with `caramel.bench.lower_bound.profile_workload` (the bench's call, with the
quarter batch a pipeline adds), in two modes, alternating `--repeats` times:

- `concurrent`: every rank at once (what the bench did before `caramel.profile.turns`);
- `turns`: one rank at a time, the others waiting (`profile_in_turns`).

Prints and saves, per mode and rank, the profile's step, forward and backward, and the
quarter-batch forward + backward (the pipeline's fixed cost per microbatch comes from it);
`--save-profiles DIR`: rank 0's first profile of each mode, as JSON.

    python experiments/profile_turns.py --model resnet18 --model-option width=16 --batch-size 12 \
        --ranks 4 --repeats 2 --json out.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.multiprocessing as mp


def _summary(profile) -> dict:
    small_f = sum(m.small_batch_forward_time_s or 0.0 for m in profile.modules)
    small_b = sum(m.small_batch_backward_time_s or 0.0 for m in profile.modules)
    return {"step_s": profile.step_time_s, "forward_s": profile.forward_time_s,
            "backward_s": profile.backward_time_s, "small_compute_s": small_f + small_b}


def _worker(rank: int, ranks: int, args, barrier, queue) -> None:
    torch.set_num_threads(1)
    from caramel.bench.lower_bound import profile_workload
    from caramel.models.zoo import get_model

    options = dict(kv.split("=", 1) for kv in args.model_option)
    options = {k: int(v) if v.isdigit() else v for k, v in options.items()}
    for rep in range(args.repeats):
        for mode in ("concurrent", "turns"):
            w = get_model(args.model)(seed=rep, batch_size=args.batch_size, **options)
            barrier.wait()
            if mode == "concurrent":
                prof = profile_workload(w, small_batch_size=args.batch_size // 4)
                barrier.wait()
            else:
                prof = None
                for turn in range(ranks):
                    if turn == rank:
                        prof = profile_workload(w, small_batch_size=args.batch_size // 4)
                    barrier.wait()
            if args.save_profiles and rank == 0 and rep == 0:  # rank 0's of each mode, to replay predictions on
                prof.save(os.path.join(args.save_profiles, f"profile_{mode}.json"))
            queue.put((mode, rep, rank, _summary(prof)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--model-option", action="append", default=[])
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--save-profiles", default=None, help="directory for rank 0's first profile of each mode")
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(args.ranks), ctx.Queue()
    t0 = time.time()
    procs = [ctx.Process(target=_worker, args=(r, args.ranks, args, barrier, queue)) for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    rows = [queue.get(timeout=900) for _ in range(args.ranks * args.repeats * 2)]
    for proc in procs:
        proc.join()
    rows.sort()
    for mode, rep, rank, s in rows:
        print(f"{mode:10s} rep {rep} rank {rank}: step {s['step_s'] * 1e3:6.1f} ms (fwd {s['forward_s'] * 1e3:5.1f}, "
              f"bwd {s['backward_s'] * 1e3:5.1f}), quarter batch fwd+bwd {s['small_compute_s'] * 1e3:5.1f} ms")
    for mode in ("concurrent", "turns"):
        steps = sorted(s["step_s"] for m, _, _, s in rows if m == mode)
        print(f"{mode}: median step {steps[len(steps) // 2] * 1e3:.1f} ms over {len(steps)} profiles")
    print(f"wall {time.time() - t0:.1f} s; cpu_count {os.cpu_count()}; load {os.getloadavg()}")
    if args.json:
        from caramel.jsonio import format_tag, write_json
        write_json(args.json, {"format": format_tag("profile-turns"), "args": vars(args), "cpu_count": os.cpu_count(),
                               "rows": [{"mode": m, "repeat": r, "rank": k, **s} for m, r, k, s in rows]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
