"""Traced pipeline stages: torch.fx's interpreter against the generated code, and eager layers.

A model that is no `nn.Sequential` is cut into stages by torch's tracer, whose stage modules
run their graph through `torch.fx.Interpreter` unless switched to the generated code (what
`Pipeline` does, `units.compiled_forward`). This times one microbatch's forward and backward
three ways, interleaved round by round on one thread: the whole model run eagerly, the two
traced stages on the interpreter, the same stages on the generated code (the second stage's
input gradient carried back into the first, as the pipeline does). It checks the stages'
gradients equal the eager model's.

    python experiments/pipeline_traced_stages.py --model resnet18 --width 16 --cut layer3 \
        --microbatch 4 --json docs/results/pipeline_traced_stages.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from caramel.jsonio import write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--cut", default="layer3", help="the module that begins stage 1")
    ap.add_argument("--microbatch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5, help="timed steps per way per round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from torch.distributed.pipelining import SplitPoint
    from torch.distributed.pipelining import pipeline as trace_pipeline

    from caramel.models import get_model
    from caramel.strategies.pipeline.units import compiled_forward

    w = get_model(args.model)(seed=0, width=args.width, batch_size=max(8, args.microbatch))
    x, y = w.inputs[:args.microbatch], w.targets[:args.microbatch]
    model, loss_fn = w.model, w.loss_fn
    pipe = trace_pipeline(model, mb_args=(x,), split_spec={args.cut: SplitPoint.BEGINNING})
    stages = [pipe.get_stage_module(i) for i in range(2)]

    def eager() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    def traced() -> None:
        for s in stages:
            s.zero_grad(set_to_none=True)
        h = stages[0](x)
        h1 = h.detach().requires_grad_()
        loss_fn(stages[1](h1), y).backward()
        h.backward(h1.grad)

    eager()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    traced()
    got = {n: p.grad for s in stages for n, p in s.named_parameters()}
    grad_diff = max((got[n] - ref[n]).abs().max().item() for n in got if n in ref)

    def interpreted() -> None:
        for s in stages:
            for m in s.modules():
                if hasattr(m, "_run_with_interpreter"):
                    m._run_with_interpreter = True
        traced()

    def generated() -> None:
        for s in stages:
            compiled_forward(s)
        traced()

    ways = {"eager": eager, "interpreter": interpreted, "generated": generated}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(args.rounds + 1):
        for name, f in ways.items():
            f()  # the toggle and a warm step, untimed
            for _ in range(args.reps):
                t = time.perf_counter()
                f()
                if r:
                    times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    out = {"format": "caramel.pipeline-traced-stages/1", "model": args.model, "width": args.width, "cut": args.cut,
           "microbatch": args.microbatch, "rounds": args.rounds, "reps": args.reps, "torch": torch.__version__,
           "max_grad_diff": grad_diff, "median_ms": med,
           "interpreter_over_generated": med["interpreter"] / med["generated"],
           "generated_over_eager": med["generated"] / med["eager"]}
    print(json.dumps(out, indent=1))
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
