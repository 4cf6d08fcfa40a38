"""The bench job's profiles: with every rank at once, and, for a pipeline, each host's ranks in turns.

Every rank profiles the workload at once first (`profile_workload`), as the bench always did:
compute under the rounds' contention, for the simulator's lower bound. In a job with a pipeline
the ranks then profile again in turns (`caramel.profile.turns.in_turns`: one rank of each host
at a time, the others idle in a barrier), and that profile is the one the predictions and the
pipelines' plans take. The ratio of the two steps (median over ranks) is how many times faster
a rank computes alone than beside its host's other ranks (`alone_speedup`), which, with the
most ranks any host runs, goes in the profile's `meta["host_sharing"]` and from there into the
ClusterSpec (`caramel.profile.turns.sharing_of`), where the pipeline simulator reads it (`caramel.strategies.pipeline
.sharing`). Data parallelism's predictions do not change: their speeds are each rank's
compute-only step in the rounds (all at once) over the profile's step, whichever profile.

Cost: one profile at once plus `ranks per host` profiles one after another (ResNet-18 width 16,
batch 12 and its quarter, 4 ranks on 2 cores: some 4 s more; on one rank per machine one more
profile). A job without a pipeline profiles at once only, as before.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

from caramel.bench.lower_bound import profile_workload
from caramel.profile.turns import SHARING_KEY, SHARING_MODEL, in_turns, ranks_per_host, sharing_speedup


def job_profile(make_workload: Callable[[], Any], small_batch_size: int | None,
                turns: bool = True) -> tuple[Any, Any]:
    """(the predictions' profile, the profile taken all at once); every rank calls it. Without
    `turns` both are the one taken at once. Either may be None (no profiler). A rank whose turn
    fails (`make_workload` raising) raises its error, and every other rank a RuntimeError
    naming that rank and the error, rather than waiting on it until the group's timeout."""
    workload = make_workload()
    dist.barrier()  # all start at once: a rank that starts late profiles partly alone
    together = profile_workload(workload, small_batch_size=small_batch_size)
    del workload  # each turn makes its own copy: never two models held at once
    dist.barrier()
    if not turns:
        return together, together
    alone = error = None
    try:  # in_turns raises only after its last barrier, so every rank reaches the gather below
        alone, hosts = in_turns(lambda: profile_workload(make_workload(), small_batch_size=small_batch_size))
    except Exception as e:  # noqa: BLE001 - gathered, then raised on every rank
        error = e
    mine = [getattr(p, "step_time_s", None) for p in (together, alone)]
    mine.append(None if error is None else f"{type(error).__name__}: {error}")
    steps: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(steps, mine)
    failed = [(rank, msg) for rank, (_, _, msg) in enumerate(steps) if msg is not None]
    if error is not None:
        raise error
    if failed:  # another rank's turn failed: it raises there; say so here rather than wait on it later
        rank, msg = failed[0]
        raise RuntimeError(f"profiling in turns failed on rank {rank}: {msg}")
    if alone is None:
        return together, together
    together_s = [t for t, _, _ in steps]
    alone_s = [a for _, a, _ in steps]
    ok = all(isinstance(v, float) for v in together_s + alone_s)
    alone.meta[SHARING_KEY] = {
        "alone_speedup": sharing_speedup(together_s, alone_s) if ok else 1.0,
        "ranks_per_host": ranks_per_host(hosts),
        "together_step_s": together_s, "alone_step_s": alone_s, "hosts": len(set(hosts)),
        "model": SHARING_MODEL}  # the simulator's sharing model this run is predicted with (replays keep it)
    return alone, together


def sharing_note(profile: Any) -> str:
    """One line for the bench's log: the steps at once and in turns, and what they give."""
    shared = (getattr(profile, "meta", None) or {}).get(SHARING_KEY)
    if not shared:
        return "all ranks at once"
    ms = lambda xs: ", ".join(f"{1e3 * x:.1f}" for x in xs)  # noqa: E731
    return (f"steps at once {ms(shared['together_step_s'])} ms, in turns {ms(shared['alone_step_s'])} ms: "
            f"{shared['alone_speedup']:.2f}x faster alone, {shared['ranks_per_host']} ranks per host")
