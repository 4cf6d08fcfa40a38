"""What the emulated links cost the host's cores, by MTU: 2 workers on an emulated cluster, each
computing the bench's ResNet-18 step and all-reducing its gradient bytes (DDP's buckets, the
bench's comm-only baseline), once one after the other ("serial") and once both at once
("concurrent", the bench's perfect-overlap baseline), in alternating blocks.

    sudo python experiments/link_cost.py --rates 250mbit,500mbit,1gbit --mtus 9000,auto --repeats 2

Prints one row per link rate and MTU: the host's sys + softirq time per step (both workers, all
cores), the slowest rank's compute when alone and when a transfer runs beside it, and the step
time of both schedules. Each (rate, MTU) is its own cluster (an MTU is fixed when the links are
made); `--repeats` runs the list that many times, alternating, so drift hits every row alike.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from caramel.jsonio import format_tag, read_json, write_json

WORKER_KIND = "link-cost-worker"  # rank 0's medians for one cluster, read back by the parent


def _host_cpu_ms() -> tuple[float, float]:
    """sys and softirq time of the whole host so far, in ms (/proc/stat counts clock ticks)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ms_per_tick = 1e3 / os.sysconf("SC_CLK_TCK")
    return fields[2] * ms_per_tick, fields[6] * ms_per_tick


def worker(out_path: str, rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from caramel.bench.baselines import CommOnly, ComputeOnly
    from caramel.bench.harness import round_order
    from caramel.models import get_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = get_model("resnet18")(seed=0, batch_size=8, width=16)
    compute = ComputeOnly(w.model, torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9),
                          w.inputs, w.targets, w.loss_fn, torch.device("cpu"))
    comm = CommOnly(w.model, torch.device("cpu"))

    def step(concurrent: bool) -> float:
        works = comm.issue() if concurrent else None
        t0 = time.perf_counter()
        compute.step()
        compute_s = time.perf_counter() - t0
        for work in works if works is not None else comm.issue():
            work.wait()
        return compute_s

    stats: dict[str, dict[str, list[float]]] = {m: {"step": [], "compute": [], "sys": [], "softirq": []}
                                                 for m in ("serial", "concurrent")}
    for concurrent in (False, True):
        for _ in range(3):
            step(concurrent)
    for r in range(rounds):
        for mode in round_order(["serial", "concurrent"], r):
            dist.barrier()
            step(mode == "concurrent")
            sys0, soft0 = _host_cpu_ms()
            t0 = time.perf_counter()
            computes = [step(mode == "concurrent") for _ in range(steps)]
            s = stats[mode]
            s["step"].append((time.perf_counter() - t0) / steps)
            s["compute"].append(statistics.median(computes))
            sys1, soft1 = _host_cpu_ms()
            s["sys"].append((sys1 - sys0) / steps)
            s["softirq"].append((soft1 - soft0) / steps)
    mine = {m: {k: statistics.median(v) for k, v in s.items()} for m, s in stats.items()}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        # the job runs at its slowest rank's pace; host CPU is the same counter on every rank
        result = {m: {"step_s": max(e[m]["step"] for e in everyone), "compute_s": max(e[m]["compute"] for e in everyone),
                      "host_sys_ms": mine[m]["sys"], "host_softirq_ms": mine[m]["softirq"]} for m in mine}
        write_json(out_path, {"format": format_tag(WORKER_KIND), **result})
    dist.barrier()
    dist.destroy_process_group()


def _row(rate: str, mtu: int, runs: list[dict]) -> str:
    def med(mode: str, key: str) -> float:
        return statistics.median(r[mode][key] for r in runs)

    cpu = {m: med(m, "host_sys_ms") + med(m, "host_softirq_ms") for m in ("serial", "concurrent")}
    alone, beside = med("serial", "compute_s") * 1e3, med("concurrent", "compute_s") * 1e3
    return (f"| {rate} | {mtu} | {cpu['serial']:.1f} | {cpu['concurrent']:.1f} | {alone:.1f} | {beside:.1f} "
            f"(x{beside / alone:.2f}) | {med('serial', 'step_s') * 1e3:.1f} | {med('concurrent', 'step_s') * 1e3:.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="250mbit,500mbit,1gbit")
    p.add_argument("--mtus", default="9000,auto", help="comma-separated MTUs in bytes, or auto")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.rounds, args.steps)
        return 0

    import tempfile

    from caramel.cluster.local import worker_env
    from caramel.cluster.config import ClusterConfig
    from caramel.cluster.emulated import EmulatedCluster

    env = {k: v for k, v in worker_env(threads=1).items() if k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")}
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="caramel-link-cost-") as tmp:
        for rep in range(args.repeats):
            for rate in args.rates.split(","):
                mtus = args.mtus.split(",")
                for mtu_text in mtus if rep % 2 == 0 else mtus[::-1]:
                    config = ClusterConfig(workers=2, bandwidth_bps=rate, mtu=mtu_text, fallback="error", quiet=True)
                    out = os.path.join(tmp, f"{rep}-{rate}-{config.mtu}.json")
                    cmd = [sys.executable, os.path.abspath(__file__), "--worker", out,
                           "--rounds", str(args.rounds), "--steps", str(args.steps)]
                    with EmulatedCluster(config) as cluster, open(os.devnull, "w") as quiet:
                        rc = cluster.run(cmd, env=env, timeout_s=300, out=quiet)
                    if not os.path.exists(out):
                        print(f"{rate} mtu {config.mtu}: the job failed (exit code {rc})", file=sys.stderr)
                        continue
                    run = read_json(out, WORKER_KIND)
                    results.setdefault((rate, config.mtu), []).append({m: run[m] for m in ("serial", "concurrent")})
                    print(f"done: {rate} mtu {config.mtu} (repeat {rep + 1})", file=sys.stderr, flush=True)
    print("| link | MTU | host sys+softirq per step, serial (ms) | concurrent (ms) | compute alone (ms) "
          "| compute beside the transfer (ms) | serial step (ms) | concurrent step (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (rate, mtu), runs in results.items():
        print(_row(rate, mtu, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
