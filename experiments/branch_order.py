"""Does reordering independent forward branches pay? A simulator study (issue: computation
scheduling, branchy graphs), not a unit test.

    python -m experiments.branch_order [--json OUT]

Lazy updates make each branch of a block wait for its own parameters, so running first the
branch whose parameters arrive first could hide another branch's transfer behind compute. The
study builds two models as profiles (compute split by FLOPs, as `caramel.sim.synthetic` does
for ResNet-50), plans each with the `caramel` planner at comm/compute 0.5, 1 and 2 on 2 and 8
workers, and simulates:

- GoogLeNet for 32x32 inputs: nine Inception blocks of four branches each;
- a two-tower model: a 4M-parameter embedding tower (many bytes, little compute) beside a
  convolution tower (the opposite), then a head.

For each, the default branch order is compared with every permutation of the branches, the
same in every block (24 for Inception, 2 for the towers), each planned and simulated; the report
is the best permutation's predicted step time over the default's.
"""
from __future__ import annotations

import argparse
import itertools

from caramel.jsonio import format_tag, write_json
from caramel.sim.simulate import simulate
from caramel.sim.synthetic import _chain_profile
from caramel.strategies.planners import make_plan
from caramel.topology.spec import ClusterSpec

Layer = tuple[str, str, int, float]  # name, type, parameter bytes, FLOPs


def conv(name: str, cin: int, cout: int, k: int, hw: int) -> list[Layer]:
    """A conv and its BatchNorm (CIFAR GoogLeNet's layout)."""
    return [(name, "Conv2d", cout * cin * k * k * 4, 2.0 * cout * cin * k * k * hw * hw),
            (f"{name}.bn", "BatchNorm2d", 2 * cout * 4, 8.0 * cout * hw * hw)]


def inception(name: str, cin: int, n1: int, r3: int, n3: int, r5: int, n5: int, pool: int, hw: int) -> list[list[Layer]]:
    return [conv(f"{name}.b1", cin, n1, 1, hw),
            conv(f"{name}.b2a", cin, r3, 1, hw) + conv(f"{name}.b2b", r3, n3, 3, hw),
            conv(f"{name}.b3a", cin, r5, 1, hw) + conv(f"{name}.b3b", r5, n5, 3, hw) + conv(f"{name}.b3c", n5, n5, 3, hw),
            [(f"{name}.b4pool", "MaxPool2d", 0, 9.0 * cin * hw * hw)] + conv(f"{name}.b4", cin, pool, 1, hw)]


def googlenet() -> list[list[Layer] | list[list[Layer]]]:
    """Blocks: a plain list of layers (a chain) or a list of branches."""
    cfg = [("a3", 192, 64, 96, 128, 16, 32, 32, 32), ("b3", 256, 128, 128, 192, 32, 96, 64, 32),
           ("a4", 480, 192, 96, 208, 16, 48, 64, 16), ("b4", 512, 160, 112, 224, 24, 64, 64, 16),
           ("c4", 512, 128, 128, 256, 24, 64, 64, 16), ("d4", 512, 112, 144, 288, 32, 64, 64, 16),
           ("e4", 528, 256, 160, 320, 32, 128, 128, 16), ("a5", 832, 256, 160, 320, 32, 128, 128, 8),
           ("b5", 832, 384, 192, 384, 48, 128, 128, 8)]
    return [conv("pre", 3, 192, 3, 32)] + [inception(*c) for c in cfg] + [[("linear", "Linear", 1024 * 10 * 4, 2.0 * 1024 * 10)]]


def two_tower() -> list:
    emb = [("emb", "Embedding", 4_000_000 * 4, 2.0 * 64 * 256), ("emb.proj", "Linear", 256 * 256 * 4, 2.0 * 64 * 256 * 256)]
    cnn = conv("c1", 3, 64, 3, 32) + conv("c2", 64, 128, 3, 16) + conv("c3", 128, 256, 3, 8)
    return [[emb, cnn], [("head", "Linear", 512 * 10 * 4, 2.0 * 512 * 10)]]


def flatten(blocks: list, perm: tuple[int, ...] | None) -> list[Layer]:
    out: list[Layer] = []
    for b in blocks:
        if b and isinstance(b[0], list):  # branches
            order = perm if perm is not None and len(perm) == len(b) else range(len(b))
            for i in order:
                out.extend(b[i])
        else:
            out.extend(b)
    return out


def profile_of(layers: list[Layer], compute_s: float):
    return _chain_profile("study", [(n, t, [(f"{n}.weight", max(4, b))]) for n, t, b, _ in layers],
                          [f for *_, f in layers], compute_s / 3, 2 * compute_s / 3, 0.0, "float32")


def step_s(layers: list[Layer], workers: int, ratio: float, compute_s: float = 0.1) -> float:
    prof = profile_of(layers, compute_s)
    grad = prof.total_grad_bytes()
    # comm/compute = ratio: ring all-reduce moves 2(n-1)/n of the bytes over each link
    bw_bps = 8 * grad * 2 * (workers - 1) / workers / (ratio * compute_s)
    cluster = ClusterSpec.uniform(workers, bw_bps, 50e-6)
    plan = make_plan("caramel", prof, cluster, world_size=workers, compute_schedule="off", input_spread=0)
    return simulate(prof, cluster, plan, trace=False).step_time_s


def study(name: str, blocks: list) -> list[dict]:
    n_branches = max(len(b) for b in blocks if b and isinstance(b[0], list))
    rows = []
    for workers in (2, 8):
        for ratio in (0.5, 1.0, 2.0):
            default = step_s(flatten(blocks, None), workers, ratio)
            perms = {p: step_s(flatten(blocks, p), workers, ratio) for p in itertools.permutations(range(n_branches))}
            best = min(perms, key=perms.get)
            rows.append({"model": name, "workers": workers, "comm_compute": ratio, "default_step_s": default,
                         "best_order": list(best), "best_step_s": perms[best], "gain": default / perms[best] - 1})
            print(f"{name:10s} n={workers} ratio {ratio}: default {default * 1e3:.2f} ms, best order {best} "
                  f"{perms[best] * 1e3:.2f} ms ({rows[-1]['gain'] * 100:+.2f}%)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    rows = study("googlenet", googlenet()) + study("two_tower", two_tower())
    if args.json:
        write_json(args.json, {"format": format_tag("branch_order"), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
