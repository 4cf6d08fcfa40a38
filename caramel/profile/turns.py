"""Profile on every rank without the ranks of one host slowing each other: they take turns.

Ranks that run under one kernel share its cores. Profiled all at once, 4 ranks of one thread
on a 2-core host each measured their model about 2.1x slower than alone (ResNet-18 width 16,
batch 12: median step 102.1 against 48.2 ms, docs/results/pipeline_profile_turns/), and the
pipeline simulator then charged every stage that whole slowdown, though a pipeline's ranks
seldom all compute at once. In turns, each host's ranks profile one after another while the
others wait in a barrier (idle, not computing); different hosts take their turns at the same
time, so on a cluster of one rank per machine this costs one profile, as before, and on a
shared host `ranks per host` profiles.

`host_of` names the host as `caramel.topology.probe.host_core_share` does (the kernel's boot
id: the emulated cluster's network namespaces all run under one).
"""
from __future__ import annotations

import socket
from typing import Any, Callable, TypeVar

from caramel.errors import FormatError

T = TypeVar("T")
SHARING_KEY = "host_sharing"  # where a profile taken in turns keeps what the turns measured
# the pipeline simulator's sharing model a profile taken now is predicted with, kept in the profile so
# that its replays keep it whatever the default becomes ("layout": docs/results/pipeline_stage_sharing/)
SHARING_MODEL = "layout"
# the models a profile may name: the same as `caramel.topology.spec.SHARING_MODELS` (a sibling package
# this one may not import; tests/strategies/pipeline/test_sharing_stage.py holds them equal)
SHARING_MODELS = ("layout", "stage")


def host_of() -> str:
    """This process's host: the kernel's boot id (one per machine, shared by its namespaces)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def turn_order(hosts: list[str]) -> list[int]:
    """Each rank's turn: its place among the ranks of its host, in rank order (so hosts run
    their turns side by side)."""
    seen: dict[str, int] = {}
    turns = []
    for h in hosts:
        turns.append(seen.get(h, 0))
        seen[h] = turns[-1] + 1
    return turns


def in_turns(fn: Callable[[], T], group: Any = None) -> tuple[T, list[str]]:
    """`fn()` on every rank of `group`, the ranks of one host one at a time (a barrier after
    each turn, the waiting ranks idle in it). Every rank of the group must call it. Returns
    this rank's result and every rank's host; an error in `fn` is raised after the last turn,
    so the other ranks' barriers are not left waiting. One process (no process group): `fn()`."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return fn(), [host_of()]
    hosts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, host_of(), group=group)
    turns = turn_order(hosts)
    mine = turns[dist.get_rank(group)]
    result, error = None, None
    for turn in range(max(turns) + 1):
        if turn == mine:
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - raised after the turns, so no rank waits on this one
                error = e
        dist.barrier(group=group)
    if error is not None:
        raise error
    return result, hosts


def sharing_speedup(together_s: list[float], alone_s: list[float]) -> float:
    """How many times faster a rank computes alone on its host than with all the host's ranks
    computing at once: the median over ranks of (together / alone), at least 1 (a rank cannot
    gain from company; a lower ratio is noise). Empty or non-positive inputs give 1."""
    ratios = sorted(t / a for t, a in zip(together_s, alone_s) if t > 0 and a > 0)
    if not ratios:
        return 1.0
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return max(1.0, median)


def ranks_per_host(hosts: list[str]) -> int:
    """The most ranks any one host runs."""
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    return max(counts.values(), default=1)


def sharing_of(profile: Any) -> dict[str, Any]:
    """The ClusterSpec fields a profile's host sharing gives (`alone_speedup`, `ranks_per_host`,
    and `sharing_model` where the profile names one, as the bench's have since the per-stage
    model (`SHARING_MODEL`); one without it was predicted with one factor per layout and replays
    so); none for a
    profile taken without turns, or where every rank has a host of its own (the measured ratio
    is then noise: nobody shares its cores)."""
    shared = (getattr(profile, "meta", None) or {}).get(SHARING_KEY)
    if not shared or int(shared["ranks_per_host"]) <= 1:
        return {}
    out = {"alone_speedup": float(shared["alone_speedup"]), "ranks_per_host": int(shared["ranks_per_host"])}
    if "model" in shared:
        if shared["model"] not in SHARING_MODELS:
            raise FormatError(f"profile meta {SHARING_KEY!r}: 'model' must be one of {', '.join(SHARING_MODELS)}, "
                              f"got {shared['model']!r}")
        out["sharing_model"] = shared["model"]
    return out
