"""Worker functions for the unequal-replica pipeline tests (spawned; must be importable)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import caramel
from tests.strategies.pipeline.workers import batch, make_model, max_diff, sgd

STEPS = 3


def oracle(steps: int, opt: str, size: int, keep: slice = slice(None), firsts: list[int] | None = None,
           cuts: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Single-process training on each step's whole batch (or only its samples `keep`), from
    `start(firsts, cuts)` (each stage's layers from its first rank's seed; all seed 0 by default)."""
    model = start(firsts, cuts) if firsts else make_model()
    o = torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam" else sgd(model.parameters())
    for step in range(steps):
        x, y = batch(step, size=size)
        F.cross_entropy(model(x[keep]), y[keep]).backward()
        o.step()
        o.zero_grad()
    return model.state_dict()


def unequal_worker(rank: int, world: int, configs: dict, steps: int = STEPS, train_root: str | None = None) -> dict:
    """Each config (replicas, schedule, optimizer, microbatches, batch size) trained `steps`
    steps, every rank passing the same whole batch; its parameters against the oracle's; then
    closed (its process groups destroyed). The first config builds each rank's model from the
    rank's own seed: a stage's replicas start from its first rank's parameters, as DDP's do."""
    from torch.distributed.distributed_c10d import _world

    out = {}
    for k, (name, (replicas, schedule, opt, micro, size)) in enumerate(configs.items()):
        model = make_model(seed=rank if k == 0 else 0)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam" else sgd
        stages = len(str(replicas).split("+")) if isinstance(replicas, str) else len(replicas)
        before = len(_world.pg_map)
        # microbatches="auto": the count and the cut both chosen from a profile (on rank 0, sent to all)
        pipe = caramel.pipeline(model, optimizer, stages=stages, microbatches=micro, schedule=schedule,
                                partition="auto" if micro == "auto" else [3, 5][: stages - 1], replicas=replicas)
        made = len(_world.pg_map) - before
        losses = [float(pipe.step(*batch(step, size=size), F.cross_entropy)) for step in range(steps)]
        final = pipe.state_dict()
        half = size // 2
        # the first config's start: each stage from its first rank's seed (stage-major ranks)
        firsts = [sum(pipe.layout.counts[:s]) for s in range(stages)] if k == 0 else [0] * stages
        cuts = [0, *pipe.boundaries, len(model)]
        out[name] = {"diff": max_diff(final, oracle(steps, opt, size, firsts=firsts, cuts=cuts)), "losses": losses,
                     # control: the first half of each batch alone gives other parameters
                     "half_diff": max_diff(final, oracle(steps, opt, size, slice(0, half), firsts, cuts)),
                     "stage": pipe.layout.stage, "replica": pipe.layout.replica,
                     "virtual": [v for v, _, _ in pipe.layout.virtual], "bubble": pipe.bubble_stats(),
                     "microbatches": pipe.options.microbatches, "boundaries": pipe.boundaries,
                     # this rank's stage as plain floats (tensors in the result queue outlive no worker)
                     "own": torch.cat([v.detach().reshape(-1).float()
                                       for v in pipe.stage_modules[0].state_dict().values()]).tolist()}
        # the first loss equals the oracle's first loss on the whole batch (every rank has it)
        x, y = batch(0, size=size)
        with torch.no_grad():
            out[name]["first_loss"] = float(F.cross_entropy(start(firsts, cuts)(x), y))
        out[name]["close"] = closes(pipe, made)
    if world == 3:
        out["batch_error"] = other_batch(rank)
        from tests.strategies.pipeline.workers import tied_sequential

        try:  # a tied weight split across the stages: refused with unequal counts
            caramel.pipeline(tied_sequential(), sgd, stages=2, microbatches=4, schedule="gpipe", partition=[2],
                             replicas="2+1").step(*batch(0, size=8), F.cross_entropy)
            out["tied_error"] = None
        except caramel.CaramelError as e:
            out["tied_error"] = str(e)
    if train_root is not None:  # `caramel train`'s straight run and first half, resumed in a fresh spawn
        from tests.train.unequal_resume import first_half

        out["train"] = first_half(train_root)
    if world == 4:
        out["auto"] = auto_replicas(rank)
    if world == 4:  # counts that do not sum to the world: one clear error on every rank, before any group
        try:
            caramel.pipeline(make_model(), sgd, stages=2, microbatches=4, schedule="gpipe", replicas="2+1")
        except caramel.CaramelError as e:
            out["world_error"] = str(e)
        # the equal hybrid's pipeline and replica groups go too, here by caramel.shutdown()
        before = len(_world.pg_map)
        pipe = caramel.pipeline(make_model(), sgd, stages=2, microbatches=4, schedule="gpipe", partition=[3],
                                replicas=2, replica_reduce="ddp")
        made = len(_world.pg_map) - before
        pipe.step(*batch(0), F.cross_entropy)
        out["equal_close"] = closes(pipe, made, shutdown=True)
    return out


def auto_replicas(rank: int, size: int = 12) -> dict:
    """replicas="auto" from a profile of the model whose first linear layer is made 50x slower
    (so the choice is certain): with stages="auto" and 6 microbatches the front gets 3 of
    the 4 workers (3+1, virtual pipelines); with 2 stages and 4 microbatches only 2+2 divides
    the count (two pipelines, each on half the batch). Each against single-process training on
    the whole batch; every rank reports rank 0's choice."""
    import dataclasses

    import torch.distributed as dist

    from caramel.profile.profiler import profile_model
    from caramel.topology.spec import ClusterSpec

    box = [None]
    if rank == 0:
        x, y = batch(0, size=size)
        prof = profile_model(make_model(), x, y, F.cross_entropy, steps=2, small_batch_size=2)
        # fixed times, not the measured ones: two profiling steps on a loaded host can swing a
        # module's time past the 50x that makes the choice certain (seen once under `-n 2`)
        slow = {"0"}  # the first nn.Linear
        modules, start_s = [], 0.0
        for m in prof.modules:
            fwd_s = 1e-4 * (50 if m.name in slow else 1)
            bwd_s = 2 * fwd_s
            split = dict(input_grad_time_s=bwd_s / 2, weight_grad_time_s=bwd_s / 2) if m.splittable else {}
            modules.append(dataclasses.replace(m, forward_start_s=start_s, forward_time_s=fwd_s, backward_time_s=bwd_s,
                                               small_batch_forward_time_s=0.4 * fwd_s,
                                               small_batch_backward_time_s=0.4 * bwd_s, **split))
            start_s += fwd_s
        prof.modules = modules
        box[0] = prof
    dist.broadcast_object_list(box, src=0)
    out = {}
    for name, kwargs in (("3+1", dict(stages="auto", microbatches=6)), ("2x2", dict(stages=2, microbatches=4))):
        pipe = caramel.pipeline(make_model(), sgd, replicas="auto", schedule="gpipe", profile=box[0],
                                cluster=ClusterSpec.uniform(4, 1e10), **kwargs)
        losses = [float(pipe.step(*batch(step, size=size), F.cross_entropy)) for step in range(STEPS)]
        final = pipe.state_dict()
        choice = pipe.replica_choice
        out[name] = {"counts": choice.counts, "microbatches": choice.microbatches, "boundaries": pipe.boundaries,
                     "partition_replicas": pipe.partition.replicas, "slowest_s": pipe.partition.slowest_s,
                     "options": (pipe.options.stages, pipe.options.replicas, pipe.options.microbatches),
                     "losses": losses, "diff": max_diff(final, oracle(STEPS, "sgd", size)),
                     "half_diff": max_diff(final, oracle(STEPS, "sgd", size, slice(0, size // 2)))}
        pipe.close()
    return out


def start(firsts: list[int], cuts: list[int]) -> torch.nn.Sequential:
    """The model the job starts from: stage s's layers (cuts[s]..cuts[s+1]) from seed firsts[s]."""
    model = make_model(seed=firsts[0])
    for s, seed in enumerate(firsts):
        if seed != firsts[0]:
            model[cuts[s]: cuts[s + 1]].load_state_dict(make_model(seed=seed)[cuts[s]: cuts[s + 1]].state_dict())
    return model


def other_batch(rank: int) -> str | None:
    """Rank 1 passes another batch than the others: one error on every rank at the first step."""
    pipe = caramel.pipeline(make_model(), sgd, stages=2, microbatches=4, schedule="gpipe", partition=[3],
                            replicas="2+1")
    try:
        pipe.step(*batch(0, replica=int(rank == 1)), F.cross_entropy)
    except caramel.CaramelError as e:
        return str(e)
    finally:
        pipe.close()
    return None


def closes(pipe, made: int, shutdown: bool = False) -> dict:
    """The process groups the pipeline made (`made` more in torch's map) are gone after close()
    (or caramel.shutdown()); stepping afterwards is an error."""
    from torch.distributed.distributed_c10d import _world

    caramel.shutdown() if shutdown else pipe.close()
    left = sum(g in _world.pg_map for g in pipe.layout.created)
    try:
        pipe.step(*batch(1), F.cross_entropy)
        error = None
    except caramel.CaramelError as e:
        error = str(e)
    return {"made": made, "created": len(pipe.layout.created), "left": left, "error": error}
