"""DePRL on a label-skewed split of digits: each worker's personalized accuracy on its own data
distribution, against one shared model (DDP) and plain gossip.

    python experiments/gossip_deprl.py --workers 4 --steps 300 [--seeds 0,1,2,3,4]

Worker r's "own" classes are 3r, 3r+1, 3r+2 (mod 10); its training samples are drawn 90% from
them and 10% from the rest, and it is scored on validation samples drawn the same way (accuracy
on its own classes x 0.9 + on the others x 0.1). Every run starts from the same model and sees
the same batches; only the strategy differs. Prints one row per strategy and seed: each
worker's score and their mean; with several seeds, how often each strategy beat the shared
model per worker and on the mean. Seed s draws the batches from 7 + s and the model from s
(seed 0 is the single run of the first version).
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

from caramel.jsonio import format_tag, write_json

OWN_SHARE = 0.9
STRATEGIES = ("ddp", "gossip:topology=ring", "gossip:topology=ring,personalize=head",
              "gossip:topology=ring,personalize=head,head_steps=2")


def own_classes(rank: int) -> list[int]:
    return [(3 * rank + c) % 10 for c in range(3)]


def skewed_batches(train, rank: int, steps: int, batch: int, seed: int) -> list[torch.Tensor]:
    mine = torch.isin(train.targets, torch.tensor(own_classes(rank)))
    own, rest = mine.nonzero().flatten(), (~mine).nonzero().flatten()
    g = torch.Generator().manual_seed(seed + rank)
    n_own = int(round(batch * OWN_SHARE))
    return [torch.cat([own[torch.randint(len(own), (n_own,), generator=g)],
                       rest[torch.randint(len(rest), (batch - n_own,), generator=g)]]) for _ in range(steps)]


def score(model, val, rank: int) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(val.inputs).argmax(1)
    mine = torch.isin(val.targets, torch.tensor(own_classes(rank)))
    ok = pred == val.targets
    return OWN_SHARE * ok[mine].float().mean().item() + (1 - OWN_SHARE) * ok[~mine].float().mean().item()


def worker(rank: int, world: int, steps: int, batch: int, lr: float, seed: int = 0) -> dict:
    import caramel
    from caramel.train.data import digits_datasets
    from caramel.train.workloads import DigitsNet

    train, val = digits_datasets(0.3)
    batches = skewed_batches(train, rank, steps, batch, seed=7 + seed)
    torch.manual_seed(seed)
    base = DigitsNet(64, 1, 0.0)
    out = {}
    for spec in STRATEGIES:
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
        if spec == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(m)
        else:
            model, opt = caramel.parallelize(m, opt, spec)
        for idx in batches:
            x, y = train.batch(idx)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        if spec != "ddp":
            opt.synchronize()
        out[spec] = score(m, val, rank)
        caramel.shutdown()
    return out


def main() -> None:
    from caramel.testing import run_workers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seeds", default="0", help="comma-separated seeds, one run each")
    p.add_argument("--json", help="write the scores here")
    a = p.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    runs = {}
    for seed in seeds:
        res = run_workers(worker, a.workers, args=(a.steps, a.batch, a.lr, seed), timeout_s=1800)
        runs[seed] = table = {s: [r[s] for r in res] for s in STRATEGIES}
        for s, v in table.items():
            print(f"seed {seed} {s:55s} " + " ".join(f"{x:.3f}" for x in v) + f"   mean {sum(v) / len(v):.3f}")
    wins = {}
    for s in STRATEGIES[1:]:
        per_worker = sum(t[s][r] > t["ddp"][r] for t in runs.values() for r in range(a.workers))
        on_mean = sum(sum(t[s]) > sum(t["ddp"]) for t in runs.values())
        gain = sum(sum(t[s]) - sum(t["ddp"]) for t in runs.values()) / (a.workers * len(runs))
        wins[s] = {"workers_above_ddp": per_worker, "worker_runs": a.workers * len(runs),
                   "means_above_ddp": on_mean, "runs": len(runs), "mean_gain_points": 100 * gain}
        print(f"{s:55s} above ddp: {per_worker}/{a.workers * len(runs)} workers, {on_mean}/{len(runs)} means, "
              f"mean {100 * gain:+.2f} points")
    if a.json:
        write_json(a.json, {"format": format_tag("gossip-deprl"), "settings": vars(a),
                            "scores": {str(k): v for k, v in runs.items()}, "against_ddp": wins})


if __name__ == "__main__":
    main()
