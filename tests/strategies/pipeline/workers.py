"""Worker functions for the pipeline tests (spawned; must be importable), and their oracles."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import caramel

BATCH, MICRO = 8, 4


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32),
                         nn.Tanh(), nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 10))


def batch(step: int, replica: int = 0, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + 31 * step + replica)
    x = torch.randn(size, 16, generator=g)
    return x, (x[:, :10] * 3).argmax(dim=1)  # a learnable rule, so training converges


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def reference(steps: int, replicas: int = 1, opt: str = "sgd") -> dict[str, torch.Tensor]:
    """Single-process training on the whole (all replicas') batch; "sgd_micro": one SGD step
    per microbatch, in order (what PipeDream would be without any staleness)."""
    model = make_model()
    o = torch.optim.Adam(model.parameters(), lr=1e-3) if opt == "adam" else sgd(model.parameters())
    for step in range(steps):
        if opt == "sgd_micro":
            xs, ys = batch(step // MICRO)
            xs, ys = [xs.chunk(MICRO)[step % MICRO]], [ys.chunk(MICRO)[step % MICRO]]
        else:
            xs, ys = zip(*(batch(step, r) for r in range(replicas)))
        loss = F.cross_entropy(model(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        o.step()
        o.zero_grad()
    return model.state_dict()


def max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b), (list(a), list(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def sync_worker(rank: int, world: int, steps: int) -> dict:
    """Every synchronous schedule against single-process training; state dict round trip."""
    out = {}
    configs = {"gpipe": dict(schedule="gpipe", partition=[3]),
               "1f1b": dict(schedule="1f1b", partition=[5]),
               "interleaved": dict(schedule="interleaved", stages=4, partition=[2, 4, 6]),
               "1f1b_auto_adam": dict(schedule="1f1b", partition="auto")}
    for name, cfg in configs.items():
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3) if "adam" in name else sgd
        cfg = {"stages": 2, **cfg}
        pipe = caramel.pipeline(model, opt, microbatches=MICRO, **cfg)
        losses = [float(pipe.step(*batch(step), F.cross_entropy)) for step in range(steps)]
        state = pipe.state_dict()
        out[name] = {"diff": max_diff(state, reference(steps, opt="adam" if "adam" in name else "sgd")),
                     "losses": losses, "boundaries": pipe.boundaries}
    # load a state: every rank's stages take it (the whole model's state dict comes back the same)
    pipe.load_state_dict(reference(0))
    out["reloaded"] = max_diff(pipe.state_dict(), reference(0))
    # the bench's runner for `pipeline:...` steps the same pipeline as a user would
    from caramel.bench.matrix import Strategy
    from caramel.bench.strategies import StrategyContext, build_strategy

    model = make_model()
    x, y = batch(0)
    runner = build_strategy(Strategy("pipeline", (("partition", 5), ("schedule", "gpipe"))), model, sgd,
                            x, y, F.cross_entropy, StrategyContext(torch.device("cpu"), rank, world))
    for _ in range(STEPS_BENCH):
        runner.step()
    ref = make_model()
    opt = sgd(ref.parameters())
    for _ in range(STEPS_BENCH):
        F.cross_entropy(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    out["bench"] = {"name": runner.name, "diff": max_diff(runner.pipe.state_dict(), ref.state_dict())}
    out["tied"] = tied_in_bench(rank, world)
    out["named"] = named_sequential(rank)
    out["traced"] = traced(steps)
    out["planned"] = planned(rank, world)
    return out


def planned(rank: int, world: int) -> dict:
    """The bench hands a pipeline the job's profile and cluster (`caramel.bench.pipeline_plan`):
    the runtime then cuts where the simulator's prediction does, here on a model whose layers
    are a ModuleList (the zoo's MLP, cut by torch's tracer between its children)."""
    import torch.distributed as dist

    from caramel.bench.matrix import Strategy
    from caramel.bench.strategies import StrategyContext, build_strategy
    from caramel.models import get_model
    from caramel.profile.profiler import profile_model
    from caramel.strategies import STRATEGIES
    from caramel.topology.spec import ClusterSpec

    def fresh():
        return get_model("mlp")(batch_size=BATCH, seed=0, width=32, depth=4)

    x, y = batch(0)[0].repeat(1, 16), batch(0)[1]
    box = [profile_model(fresh().model, x, y, F.cross_entropy, steps=2, small_batch_size=2) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # rank 0's, as the runtime plans on rank 0
    cluster = ClusterSpec.uniform(world, 1e8)
    strategy = Strategy("pipeline", (("microbatches", 4),))
    ctx = StrategyContext(torch.device("cpu"), rank, world, pipeline_cluster=cluster, pipeline_profile=box[0])
    w = fresh()
    runner = build_strategy(strategy, w.model, torch.optim.SGD(w.model.parameters(), lr=0.05), x, y,
                            F.cross_entropy, ctx)
    runner.step()
    predicted = STRATEGIES.spec(strategy.name).simulate(box[0], cluster, 1).meta["boundaries"]
    # a profile made before cut_units were recorded: the runtime still cuts between the list's children
    old = copy.deepcopy(box[0])
    old.meta.pop("cut_units")
    w_old = fresh()
    old_runner = build_strategy(strategy, w_old.model, torch.optim.SGD(w_old.model.parameters(), lr=0.05), x, y,
                                F.cross_entropy, StrategyContext(torch.device("cpu"), rank, world,
                                                                 pipeline_cluster=cluster, pipeline_profile=old))
    old_runner.step()
    ref = fresh().model
    F.cross_entropy(ref(torch.cat([x] * world)), torch.cat([y] * world)).backward()
    torch.optim.SGD(ref.parameters(), lr=0.05).step()
    from caramel.bench.pipeline_plan import cluster_summary

    return {"cut": runner.pipe.boundaries, "predicted": predicted, "units": box[0].meta.get("cut_units"),
            "turns": turns(rank, fresh, x, y), "shared": shared_hand_off(rank, world, fresh, x, y, box[0]),
            "diff": max_diff(runner.pipe.state_dict(), ref.state_dict()),
            # the hand-off itself: the runtime planned at the bench's cluster, from its very profile
            "planned_at": runner.stats()["planned_at"] == cluster_summary(cluster),
            "profile_handed": runner.pipe.plan_profile is box[0],
            "old_profile": (old_runner.pipe.boundaries, max_diff(old_runner.pipe.state_dict(), ref.state_dict()))}


def turns(rank: int, fresh, x, y) -> dict:
    """`caramel.profile.turns.in_turns`: the ranks of one host run one at a time (each rank's
    interval on the host's monotonic clock, gathered); `job_profile` in turns on the MLP."""
    import time

    import torch.distributed as dist

    from caramel.bench.job_profile import job_profile
    from caramel.profile.turns import SHARING_KEY, in_turns

    def timed():
        t0 = time.monotonic()
        time.sleep(0.05)
        return (t0, time.monotonic())

    mine, hosts = in_turns(timed)
    spans: list = [None] * dist.get_world_size()
    dist.all_gather_object(spans, mine)

    def workload():
        w = fresh()
        w.inputs, w.targets = x, y
        return w

    def fails_on_rank_1():
        if rank == 1:
            raise ValueError("rank 1's profile failed")
        return "ok"

    try:  # rank 1 raises after the turns; rank 0 is not left waiting on its barrier
        failed = in_turns(fails_on_rank_1)[0]
    except ValueError as e:
        failed = str(e)
    built = []

    def fails_on_rank_1s_copy():  # rank 1 cannot build its copy for its turn
        built.append(1)
        if rank == 1 and len(built) == 2:
            raise MemoryError("no room for rank 1's copy")
        return workload()

    try:  # every rank raises, naming the cause, instead of rank 0 waiting out the timeout
        job_profile(fails_on_rank_1s_copy, 2)
        job_failed = "returned"
    except (MemoryError, RuntimeError) as e:
        job_failed = f"{type(e).__name__}: {e}"
    alone, together = job_profile(workload, 2)
    return {"spans": spans, "hosts": hosts, "failed": failed, "job_failed": job_failed,
            "sharing": alone.meta.get(SHARING_KEY),
            "together_meta": SHARING_KEY in together.meta, "alone_step_s": alone.step_time_s}


def shared_hand_off(rank: int, world: int, fresh, x, y, profile) -> dict:
    """A spec whose ranks share a host: the bench hands the runtime the speeds the prediction
    settled at (`pipeline_plan.runtime_cluster`), and it cuts where the prediction cuts."""
    from caramel.bench.matrix import Strategy
    from caramel.bench.strategies import StrategyContext, build_strategy
    from caramel.strategies import STRATEGIES
    from caramel.topology.spec import ClusterSpec

    cluster = ClusterSpec.uniform(world, 1e8, alone_speedup=2.0, ranks_per_host=world)
    strategy = Strategy("pipeline", (("microbatches", 4),))
    w = fresh()
    runner = build_strategy(strategy, w.model, torch.optim.SGD(w.model.parameters(), lr=0.05), x, y, F.cross_entropy,
                            StrategyContext(torch.device("cpu"), rank, world, pipeline_cluster=cluster,
                                            pipeline_profile=profile))  # built: cut and planned (`prepare`)
    sim = STRATEGIES.spec(strategy.name).simulate(profile, cluster, 1)
    # on a group of rank 1 alone, rank 1 computes and keeps the factor; rank 0 takes no part
    import torch.distributed as dist

    from caramel.bench.pipeline_plan import runtime_cluster
    alone = dist.new_group([1])
    in_group = runtime_cluster(profile, cluster, strategy.spec().options, alone) if rank == 1 else None
    dist.barrier()
    return {"planned_at": runner.stats()["planned_at"], "factor": sim.meta["sharing"]["factor"],
            "cut": runner.pipe.boundaries, "predicted": sim.meta["boundaries"],
            "in_group": in_group and [w.speed for w in in_group.workers]}


def named_sequential(rank: int) -> dict:
    """An nn.Sequential whose children have names, not indices, cut from a profile (partition=
    "auto", and replicas="auto"): trains as single-process training does; rebuilt from the
    options it reports, it keeps the cut. A planning failure on rank 0 alone (a profile that is
    none) is one error on every rank, not a hang."""
    from collections import OrderedDict

    import torch.distributed as dist

    from caramel.errors import CaramelError
    from caramel.profile.profiler import profile_model
    from caramel.topology.spec import ClusterSpec

    def named() -> nn.Sequential:
        return nn.Sequential(OrderedDict((f"l{i}", m) for i, m in enumerate(make_model())))

    x, y = batch(0)
    box = [profile_model(named(), x, y, F.cross_entropy, steps=2, small_batch_size=2) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ref = named()
    opt = sgd(ref.parameters())
    F.cross_entropy(ref(x), y).backward()
    opt.step()
    out = {}
    for name, kw in (("partition", dict(microbatches=MICRO)), ("replicas", dict(microbatches=2, replicas="auto"))):
        try:
            pipe = caramel.pipeline(named(), sgd, stages=2, schedule="gpipe", profile=box[0],
                                    cluster=ClusterSpec.uniform(2, 1e9), **kw)
            before = pipe.bubble_stats()["bubble_steps"]  # replicas="auto": no layout yet
            pipe.step(x, y, F.cross_entropy)
            again = caramel.pipeline(named(), sgd, options=pipe.options)
            again.step(x, y, F.cross_entropy)
            out[name] = {"diff": max_diff(pipe.state_dict(), ref.state_dict()), "cut": pipe.boundaries, "before": before,
                         "partition": pipe.options.partition, "again": again.boundaries,
                         "replanned": again.partition is not None}
            pipe.close()
            again.close()
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[name] = f"{type(e).__name__}: {e}"
    try:
        caramel.pipeline(named(), sgd, stages=2, microbatches=2, schedule="gpipe", replicas="auto",
                         profile=box[0] if rank else "no profile").step(x, y, F.cross_entropy)
        out["bad_profile"] = None
    except CaramelError as e:
        out["bad_profile"] = str(e)
    return out


def tied_sequential() -> nn.Sequential:
    """An nn.Sequential whose first and last layers share a weight (one Parameter on both stages
    of a cut at 2): the tied case without tracing, which takes seconds on tiny_gpt."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
    net[4].weight = net[0].weight
    return net


def tied_in_bench(rank: int, world: int) -> dict:
    """A tied embedding/head weight that the cut splits across the first and the last stage
    (tiny_gpt cut at blocks.1): 10 steps of AdamW under 1f1b against single-process training on
    the whole batch; each rank's copy of the tied weight, gathered; the bench's pipeline on it."""
    import torch.distributed as dist

    from caramel.bench.matrix import Strategy
    from caramel.bench.strategies import StrategyContext, StrategyUnavailable, build_strategy
    from caramel.models.zoo import tiny_gpt

    w, ref = tiny_gpt(batch_size=4, seed=0), tiny_gpt(batch_size=4, seed=0)
    pipe = caramel.pipeline(w.model, torch.optim.AdamW(w.model.parameters(), lr=1e-2), stages=2, microbatches=2,
                            schedule="1f1b", partition="blocks.1")
    opt = torch.optim.AdamW(ref.model.parameters(), lr=1e-2)
    for _ in range(10):
        pipe.step(w.inputs, w.targets, w.loss_fn)
        ref.loss_fn(ref.model(ref.inputs), ref.targets).backward()
        opt.step()
        opt.zero_grad()
    copies: list = [None] * world
    dist.all_gather_object(copies, w.model.tok.weight.detach().clone())
    state = pipe.state_dict()
    out = {"diff": max_diff(state, ref.model.state_dict()), "copies_equal": bool(torch.equal(copies[0], copies[1])),
           "one_tensor": bool(torch.equal(state["tok.weight"], state["head.weight"])),
           "moved": float((copies[0] - tiny_gpt(batch_size=4, seed=0).model.tok.weight.detach()).abs().max())}
    pipe.close()

    def tied_against_single_process(**pipeline_options) -> dict:
        """10 steps of a tied Sequential's pipeline beside one process on the whole batch."""
        seq, ref_seq = tied_sequential(), tied_sequential()
        pipe = caramel.pipeline(seq, sgd, **pipeline_options)
        opt = sgd(ref_seq.parameters())
        for step in range(10):
            pipe.step(*batch(step), F.cross_entropy)
            F.cross_entropy(ref_seq(batch(step)[0]), batch(step)[1]).backward()
            opt.step()
            opt.zero_grad()
        dist.all_gather_object(copies, seq[0].weight.detach().clone())
        result = {"diff": max_diff(pipe.state_dict(), ref_seq.state_dict()),
                  "copies_equal": bool(torch.equal(copies[0], copies[1]))}
        pipe.close()
        return result

    out["sequential"] = tied_against_single_process(stages=2, microbatches=2, schedule="gpipe", partition=[2])
    # interleaved, 4 stages on 2 ranks: the first (rank 0) and the last (rank 1) stage share it
    out["interleaved"] = tied_against_single_process(stages=4, microbatches=4, schedule="interleaved",
                                                     partition=[1, 2, 4])
    b = tiny_gpt(batch_size=4, seed=0)
    try:
        runner = build_strategy(Strategy("pipeline", (("microbatches", 2), ("partition", "blocks.1"),
                                                      ("schedule", "gpipe"))), b.model,
                                torch.optim.SGD(b.model.parameters(), lr=0.1, momentum=0.9), b.inputs, b.targets,
                                b.loss_fn, StrategyContext(torch.device("cpu"), rank, world))
        runner.step()
        out["bench"] = "ok"
    except StrategyUnavailable as e:
        out["bench"] = str(e)
    from caramel.errors import CaramelError

    try:  # pipedream's stages step apart on stashed versions: refused
        caramel.pipeline(tied_sequential(), sgd, stages=2, microbatches=2, schedule="pipedream",
                         partition=[2]).step(*batch(0), F.cross_entropy)
        out["pipedream"] = None
    except CaramelError as e:
        out["pipedream"] = str(e)
    return out


STEPS_BENCH = 3


def traced(steps: int) -> dict:
    """A model that is no nn.Sequential (the zoo's MLP, a ModuleList in a loop), cut by torch's
    tracer at a named module, against single-process training; a name it lacks is an error."""
    from caramel.errors import CaramelError
    from caramel.models import get_model

    def fresh():
        return get_model("mlp")(batch_size=BATCH, seed=0, width=32, depth=4)

    w, auto_w = fresh(), fresh()
    pipe = caramel.pipeline(w.model, torch.optim.Adam(w.model.parameters(), lr=1e-3), stages=2,
                            microbatches=MICRO, schedule="1f1b", partition=["layers.2"])
    # partition="auto" on a model that is no nn.Sequential: the partitioner names the cut itself
    auto = caramel.pipeline(auto_w.model, torch.optim.Adam(auto_w.model.parameters(), lr=1e-3), stages=2,
                            microbatches=MICRO, schedule="1f1b")
    ref = fresh().model
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    for step in range(steps):
        x = batch(step)[0].repeat(1, 16)  # the MLP takes 256 features
        y = batch(step)[1]
        pipe.step(x, y, F.cross_entropy)
        auto.step(x, y, F.cross_entropy)
        F.cross_entropy(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    bad = caramel.pipeline(fresh().model, sgd, stages=2, microbatches=MICRO, partition="layers.9")
    try:
        bad.step(x, y, F.cross_entropy)
        error = None
    except CaramelError as e:
        error = str(e)
    errors = [error]
    for make in (lambda: caramel.pipeline(make_model(), sgd, stages=3, microbatches=MICRO, partition=[2, 4]),
                 lambda: caramel.pipeline(make_model(), sgd, stages=2, microbatches=MICRO, partition=[3]).step(
                     *batch(0, size=6), F.cross_entropy)):
        try:
            make()
            errors.append(None)
        except CaramelError as e:
            errors.append(str(e))
    switchable = [(n, sub._run_with_interpreter) for m in pipe.stage_modules for n, sub in m.named_modules()
                  if hasattr(sub, "_run_with_interpreter")]
    return {"diff": max_diff(pipe.state_dict(), ref.state_dict()), "errors": errors, "switchable": switchable,
            "auto_diff": max_diff(auto.state_dict(), ref.state_dict()), "auto_boundaries": auto.boundaries}


def pipedream_reference(steps: int, cuts: list[int], vertical_sync: bool) -> dict[str, torch.Tensor]:
    """PipeDream's semantics in one process, written apart from the runtime: microbatch i's
    forward at stage s uses that stage's weights after `base + max(0, i - warmup_s)` updates
    (with vertical sync, stage 0's choice at every stage); its backward differentiates those
    same weights; each stage then applies its own update, microbatch by microbatch."""
    from torch.func import functional_call

    from caramel.strategies.pipeline.layout import split_sequential

    model = make_model()
    stages = split_sequential(model, cuts)
    n = len(stages)
    opts = [sgd(s.parameters()) for s in stages]
    history = [[{k: v.detach().clone() for k, v in s.named_parameters()}] for s in stages]
    for step in range(steps):
        xs, ys = batch(step)
        for i, (x, y) in enumerate(zip(xs.chunk(MICRO), ys.chunk(MICRO))):
            base = step * MICRO
            picks = [base + max(0, i - min(MICRO, n - s - 1)) for s in range(n)]
            if vertical_sync:
                picks = [picks[0]] * n
            leaves = [{k: v.detach().requires_grad_() for k, v in history[s][picks[s]].items()} for s in range(n)]
            h = x
            for s, stage in enumerate(stages):
                h = functional_call(stage, leaves[s], (h,))
            loss = F.cross_entropy(h, y)
            flat = [t for d in leaves for t in d.values()]
            grads = dict(zip(map(id, flat), torch.autograd.grad(loss, flat)))
            for s, stage in enumerate(stages):
                for (name, p), leaf in zip(stage.named_parameters(), leaves[s].values()):
                    p.grad = grads[id(leaf)]
                opts[s].step()
                opts[s].zero_grad()
                history[s].append({k: v.detach().clone() for k, v in stage.named_parameters()})
    return model.state_dict()


def pipedream_worker(rank: int, world: int, steps: int) -> dict:
    """Asynchronous PipeDream, with and without vertical sync, against its one-process oracle;
    the version log of every microbatch; a longer run's losses."""
    out = {}
    for vs in (False, True):
        pipe = caramel.pipeline(make_model(), sgd, stages=2, microbatches=MICRO, schedule="pipedream",
                                partition=[5], vertical_sync=vs)
        for step in range(steps):
            pipe.step(*batch(step), F.cross_entropy)
        out[vs] = {"diff": max_diff(pipe.state_dict(), pipedream_reference(steps, [5], vs)),
                   "no_stash_diff": max_diff(pipe.state_dict(), reference(steps * MICRO, opt="sgd_micro")),
                   "log": pipe._runner.log}
    pipe = caramel.pipeline(make_model(), plain_sgd, stages=2, microbatches=MICRO, schedule="pipedream",
                            partition=[3])
    out["losses"] = [float(pipe.step(*batch(step % 10), F.cross_entropy)) for step in range(CONVERGE_STEPS)]
    return out


CONVERGE_STEPS = 40


def plain_sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def sequential_losses(steps: int) -> list[float]:
    """What PipeDream's run would give without staleness: one plain SGD step per microbatch."""
    model = make_model()
    opt = plain_sgd(model.parameters())
    out = []
    for step in range(steps):
        x, y = batch(step % 10)
        losses = []
        for xc, yc in zip(x.chunk(MICRO), y.chunk(MICRO)):
            loss = F.cross_entropy(model(xc), yc)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        out.append(sum(losses) / MICRO)
    return out
