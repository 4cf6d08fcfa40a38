"""Checks shared by the checkpoint entries of a choice taken half-way (`profiling_state`,
`trial_state`): the header, plain-value types, and the one exchange that makes every rank take
the same decision on its entry.

Each rank reads its own part of an entry, and with per-rank state dicts its own copy of the
shared part. An error found by one rank alone must not leave the others waiting in the next
collective (under NCCL until the process group's timeout): every rank checks and parses what it
will use before any collective, and the ranks then all-gather (error, why not, digest of the
shared part). Any rank's error is raised on every rank; any rank's reason not to carry the entry,
or shared parts that differ, makes every rank refuse it.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable

import torch.distributed as dist

from caramel.errors import CaramelError


def check_header(entry: Any, key: str, version_max: int, required: tuple[str, ...]) -> None:
    """A mapping of a version this caramel reads, holding every required field; else one error."""
    if not isinstance(entry, dict):
        raise CaramelError(f"checkpoint: the caramel entry {key!r} must be a mapping, got {type(entry).__name__}")
    version = entry.get("version")
    if not is_int(version) or version < 1:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} has version {version!r}, expected an integer "
                           f"from 1 to {version_max}; it was not written by caramel")
    if version > version_max:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} has version {version!r}, newer than this caramel "
                           f"reads ({version_max}); resume with the caramel that saved it")
    missing = [k for k in required if k not in entry]
    if missing:
        raise CaramelError(f"checkpoint: the caramel entry {key!r} lacks {', '.join(missing)}; it was not written "
                           "by caramel")


def is_int(x: Any, lo: int | None = None) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and (lo is None or x >= lo)


def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_names(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(n, str) for n in x)


def is_map(x: Any, value: Any) -> bool:
    """A dict of string keys whose values pass `value`."""
    return isinstance(x, dict) and all(isinstance(k, str) and value(v) for k, v in x.items())


def digest(entry: dict[str, Any], fields: tuple[str, ...]) -> str:
    """A digest of the fields every rank must hold alike (written by the same code, so their
    reprs match when their values do)."""
    return hashlib.sha256(repr([entry.get(k) for k in fields]).encode()).hexdigest()


def agree(c: Any, problem: str | None, why: str | None, shared: str | None) -> str | None:
    """The ranks' common verdict (module docstring): raises any rank's `problem` on every rank;
    else why no rank carries the entry on (a rank's `why`, or shared parts that differ), or None."""
    answers: list[Any] = [None] * c.world
    dist.all_gather_object(answers, (problem, why, shared), group=c.group)
    for r, (p, _, _) in enumerate(answers):
        if p is not None:
            raise CaramelError(f"{p} (found by rank {r})")
    for r, (_, w, _) in enumerate(answers):
        if w is not None:
            return f"{w} (rank {r})"
    if len({d for _, _, d in answers}) > 1:
        return "the ranks' entries differ in what every rank must hold alike (taken at different steps?)"
    return None


def carries_on(c: Any, problem: str | None, why: Callable[[], str | None], shared: Callable[[], str],
               refused: str) -> bool:
    """Whether every rank carries its entry on: one process raises its own `problem` and carries
    nothing on; ranks take `agree`'s verdict (`why` and `shared` asked only of an entry without
    a problem), and on a refusal rank 0 prints "caramel: the checkpoint's {refused}" with why."""
    if c.world == 1:
        if problem is not None:
            raise CaramelError(problem)
        return False
    ok = problem is None
    unfit = agree(c, problem, why() if ok else None, shared() if ok else None)
    if unfit is not None:
        if c.rank == 0:
            print(f"caramel: the checkpoint's {refused.format(unfit=unfit)}", flush=True)
        return False
    return True
