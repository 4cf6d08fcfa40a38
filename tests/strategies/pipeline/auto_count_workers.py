"""Worker for the runtime's `microbatches="auto"` on 2 ranks (spawned; must be importable):
what its first rank scores, against the prediction's chooser on the same profile and spec."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import caramel
from tests.strategies.pipeline.workers import batch, max_diff, sgd, tied_sequential

SHARED = dict(alone_speedup=2.0, ranks_per_host=2)  # both ranks on one host, 2x faster alone


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10))


def auto_count_worker(rank: int, world: int) -> dict:
    """(a) no profile, a batch of 2 under 1f1b on 2 stages (2 the only count) on a shared host:
    the runtime profiles the layers at one size and trains as one process does. (b) a tied
    model's profile handed over: per schedule and spec, the runtime's score of every count and
    its cut, beside `simulate_pipeline`'s for the same counts."""
    from caramel.profile.profiler import profile_model
    from caramel.strategies.pipeline.options import PipelineOptions
    from caramel.strategies.pipeline.simulate import simulate_pipeline
    from caramel.topology.spec import ClusterSpec

    x, y = batch(0, size=2)
    out: dict = {}
    try:
        pipe = caramel.pipeline(small_model(), sgd, stages=2, microbatches="auto", schedule="1f1b",
                                cluster=ClusterSpec.uniform(2, 1e9, **SHARED))
        pipe.step(x, y, F.cross_entropy)
        ref = small_model()
        opt = sgd(ref.parameters())
        F.cross_entropy(ref(x), y).backward()
        opt.step()
        out["no_profile"] = {"microbatches": pipe.options.microbatches, "counts": sorted(pipe.microbatch_predictions_s),
                             "diff": max_diff(pipe.state_dict(), ref.state_dict())}
        pipe.close()
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["no_profile"] = f"{type(e).__name__}: {e}"
    # rank 0's profile at one sample (a batch of 2 over 2 positions), as the bench hands it
    box = [profile_model(tied_sequential(), x[:1], y[:1], F.cross_entropy, steps=2) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    for shared in (False, True):
        cluster = ClusterSpec.uniform(2, 1e8, collective_cpu_s=1e-3, **(SHARED if shared else {}))
        for schedule in ("gpipe", "1f1b"):  # counts 1 and 2; 2 alone
            pipe = caramel.pipeline(tied_sequential(), sgd, stages=2, microbatches="auto", schedule=schedule,
                                    cluster=cluster, profile=box[0])
            pipe.step(x, y, F.cross_entropy)
            table = dict(pipe.microbatch_predictions_s)
            options = PipelineOptions(stages=2, schedule=schedule, microbatches="auto")
            auto = simulate_pipeline(box[0], cluster, options)
            explicit = {m: simulate_pipeline(box[0], cluster, PipelineOptions(stages=2, schedule=schedule,
                                                                              microbatches=m)).step_time_s
                        for m in (1, 2) if schedule == "gpipe" or m == 2}
            out[(shared, schedule)] = {"table": table, "explicit": explicit, "predicted": auto.meta["microbatch_predictions_s"],
                                       "microbatches": pipe.options.microbatches, "picked": auto.meta["microbatches"],
                                       "cut": pipe.boundaries, "predicted_cut": auto.meta["boundaries"],
                                       "names": [n for n, _ in tied_sequential().named_children()]}
            pipe.close()
    return out
