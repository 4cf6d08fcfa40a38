"""Cost of leaving the engine's tracer on, with 2 workers on loopback: the same model trained by
two engines in the same processes, one tracing and one not, interleaved in rounds so that
machine drift hits both equally. Reports the ratio of median step times.

    python experiments/trace_overhead.py --model resnet18 --rounds 6 --steps 10
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time


def worker(rank: int, world: int, model_name: str, batch: int, rounds: int, steps: int, tmp: str) -> dict:
    import torch

    import caramel
    from caramel.models import get_model

    kwargs = {"width": 16} if model_name == "resnet18" else {}
    w = get_model(model_name)(batch_size=batch, seed=0, **kwargs)
    engines = {}
    times: dict[str, list[float]] = {"off": [], "on": []}

    def run(name: str, n: int) -> None:
        model, opt = engines[name]
        for _ in range(n):
            t0 = time.perf_counter()
            w.loss_fn(model(w.inputs), w.targets).backward()
            opt.step()
            opt.zero_grad()
            times[name].append(time.perf_counter() - t0)

    # the tracing engine runs the plan the other one made, so the tracer is the only difference
    m = copy.deepcopy(w.model)
    engines["off"] = caramel.parallelize(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    run("off", 6)  # profiling and planning steps
    m = copy.deepcopy(w.model)
    engines["on"] = caramel.parallelize(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                                        plan=engines["off"][1].engine.plan, trace=f"{tmp}/trace.json")
    run("on", 6)
    for name in engines:
        times[name].clear()
    for r in range(rounds):
        # ABBA order, and every pending update applied before the other engine runs, so that
        # neither inherits the other's communication
        for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
            run(name, steps)
            engines[name][1].synchronize()
    events = len(engines["on"][1].engine.recorder._events)
    return {k: statistics.median(v) for k, v in times.items()} | {"events": events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    from caramel.testing import run_workers
    with tempfile.TemporaryDirectory() as tmp:
        res = run_workers(worker, 2, args=(args.model, args.batch_size, args.rounds, args.steps, tmp), timeout_s=3000, collective_timeout_s=600)
    for rank, r in enumerate(res):
        print(f"rank {rank}: tracer off {r['off'] * 1e3:.1f} ms, on {r['on'] * 1e3:.1f} ms, "
              f"cost {(r['on'] / r['off'] - 1) * 100:+.2f}% ({r['events']} events recorded)")
    worst = max(r["on"] / r["off"] - 1 for r in res)
    print(f"tracer cost (worst rank, median step time): {worst * 100:+.2f}%  target <= 2%: {'MET' if worst <= 0.02 else 'NOT MET'}")


if __name__ == "__main__":
    main()
