"""GPU check: Caramel against torch DDP on CUDA tensors over NCCL, parity and a short timing.

    python experiments/gpu_check.py [--steps 24] [--timing-steps 40] [--cpu]

With two or more GPUs: 2 processes, one GPU each. With one: 1 process (the engine's CUDA set-up
and pass-through), then 2 processes on the same GPU, which NCCL may refuse ("duplicate GPU");
that is reported, not failed. Each run trains a small model with a tied embedding (rows travel
apart), BatchNorm (buffers broadcast) and dense layers with `overlap="forward"`, next to torch
DDP on the same data, and prints the largest parameter difference after `--steps` steps and
the median step time of each in alternating blocks. Exit status 1 when a parity check fails;
0 with a message on a machine without CUDA, where the CPU tests cover the group choice;
`--cpu` runs the same check on CPU tensors over gloo, to test the script itself.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TOLERANCE = 1e-4  # NCCL's sums may round differently from DDP's buckets; CPU parity is 1e-5


def _model(vocab: int = 512, dim: int = 256):
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.body = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            self.norm = nn.BatchNorm1d(dim)
            self.out = nn.Linear(dim, vocab, bias=False)
            self.out.weight = self.emb.weight  # tied: the embedding's rows travel apart

        def forward(self, ids):
            h = self.emb(ids).mean(1)
            return self.out(self.norm(self.body(h) + h))

    return Net()


def _worker(rank: int, world: int, port: int, steps: int, timing_steps: int, out_dir: str, cpu: bool) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import caramel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank % max(1, torch.cuda.device_count())), CARAMEL_TIMEOUT_S="120")
    result: dict = {"rank": rank, "world": world}
    try:
        info = caramel.init_distributed(backend="gloo" if cpu else None)
        device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
        result.update(backend=info.backend, device=str(device))
        torch.manual_seed(0)
        base = _model().to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=None if cpu else [device.index])
        dopt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        mine = copy.deepcopy(base)
        model, opt = caramel.parallelize(mine, torch.optim.SGD(mine.parameters(), lr=0.05, momentum=0.9),
                                         overlap="forward", profile_steps=2)
        gen = torch.Generator(device="cpu").manual_seed(1000 + rank)
        batches = [torch.randint(0, 512, (64, 16), generator=gen).to(device) for _ in range(8)]

        def step(m, o, k):
            ids = batches[k % len(batches)]
            F.cross_entropy(m(ids), ids[:, 0]).backward()
            o.step()
            o.zero_grad()

        for k in range(steps):
            step(ddp, dopt, k)
            step(model, opt, k)
        opt.synchronize()
        diff = max((a - b).abs().max().item() for a, b in
                   zip(ddp.module.state_dict().values(), model.module.state_dict().values()) if a.is_floating_point())
        comm = model.engine.comm
        try:  # an NCCL group is registered with torch; the private gloo groups are not
            engine_group = dist.get_backend(comm)
        except (ValueError, RuntimeError):
            engine_group = type(comm).__name__
        result.update(max_diff=diff, engine_group=engine_group,
                      stats={k: v for k, v in model.engine.stats_dict().items() if k in ("overlap", "buckets", "planner")})
        times: dict[str, list[float]] = {"ddp": [], "caramel": []}
        for block in range(4):
            for name, m, o in (("ddp", ddp, dopt), ("caramel", model, opt))[::1 if block % 2 == 0 else -1]:
                if not cpu:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                for k in range(timing_steps):
                    step(m, o, k)
                if name == "caramel":
                    opt.synchronize()
                if not cpu:
                    torch.cuda.synchronize(device)
                times[name].append((time.perf_counter() - t0) / timing_steps)
        result["step_ms"] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        caramel.shutdown()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported by the parent
        result["error"] = f"{type(e).__name__}: {e}"
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def _run(world: int, steps: int, timing_steps: int, timeout_s: float, cpu: bool = False) -> list[dict]:
    import torch.multiprocessing as mp

    from caramel.distributed import host_store

    with tempfile.TemporaryDirectory() as out:
        ctx = mp.get_context("spawn")
        store = host_store(timeout_s)  # bound before any worker starts; serves until this returns
        port = store.port
        procs = [ctx.Process(target=_worker, args=(r, world, port, steps, timing_steps, out, cpu)) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        return [json.loads(Path(out, f"rank{r}.json").read_text()) if Path(out, f"rank{r}.json").exists()
                else {"rank": r, "error": "no result (timed out or crashed)"} for r in range(world)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--timing-steps", type=int, default=40)
    ap.add_argument("--timeout-s", type=float, default=240.0)
    ap.add_argument("--cpu", action="store_true", help="the same check on CPU tensors over gloo (tests this script)")
    args = ap.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine; nothing to check here "
              "(tests/unit/test_comm_group.py covers the choice of NCCL for CUDA tensors on the CPU)")
        return 0
    gpus = 2 if args.cpu else torch.cuda.device_count()
    runs = [2] if gpus >= 2 else [1, 2]
    failed = False
    for world in runs:
        results = _run(world, args.steps, args.timing_steps, args.timeout_s, cpu=args.cpu)
        shared_gpu = world > gpus
        for r in results:
            print(f"world={world} rank={r['rank']}: " + json.dumps({k: v for k, v in r.items() if k != "rank"}))
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            if shared_gpu:
                print(f"world={world} on {gpus} GPU: not run as a check ({errors[0][:200]}); NCCL usually refuses "
                      "two ranks on one GPU")
                continue
            failed = True
            continue
        worst = max(r["max_diff"] for r in results)
        ok = worst <= TOLERANCE
        failed |= not ok
        ms = results[0]["step_ms"]
        print(f"world={world}: parity {'ok' if ok else 'FAILED'} (max |caramel - ddp| = {worst:.2e}, tolerance "
              f"{TOLERANCE:g}); step time ddp {ms['ddp']:.2f} ms, caramel {ms['caramel']:.2f} ms "
              f"({ms['ddp'] / ms['caramel']:.2f}x)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
