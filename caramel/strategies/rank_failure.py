"""One rank's local failure at a collective decision, raised on every rank.

A decision point does local work (a cost fit, rank 0's plan) and then a collective every rank
must reach. Were the local work to raise on one rank, that rank would leave while its peers
waited in the collective until the process group's timeout (minutes), the real error shown
on one rank only. Instead the rank catches it (`run_local`), takes part in the collective with
a `Failed` marker in place of its data, and every rank raises the same `RankFailedError`
naming the failing rank and the cause (`raise_failed`). Used by `balance="batch"`'s decisions,
the caramel controller's plan broadcast and profile build, and ps's plan broadcast.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

import torch.distributed as dist

from caramel.errors import CaramelError

T = TypeVar("T")

CAUSE_CHARS = 4000  # a cause's text longer than this (a tensor's repr) is cut before it travels


class RankFailedError(RuntimeError):
    """A rank's local work at a decision every rank takes failed; raised on every rank."""


class RankInputError(RankFailedError, CaramelError):
    """The same for a `CaramelError` (bad input): still one to callers that catch those."""


class Failed:
    """What a rank sends in place of its data when its local work raised: what it could not do
    and the cause as text. The exception itself stays on its rank (it may not pickle)."""

    def __init__(self, doing: str, cause: str, error: BaseException | None = None, bad_input: bool = False):
        self.doing, self.cause, self.error, self.bad_input = doing, cause, error, bad_input

    def __getstate__(self) -> dict[str, Any]:
        return {"doing": self.doing, "cause": self.cause, "error": None, "bad_input": self.bad_input}

    def __repr__(self) -> str:
        return f"Failed({self.doing!r}, {self.cause!r})"


def run_local(work: Callable[[], T], doing: str, alone: bool = False) -> T | Failed:
    """`work()`, or a `Failed` marker when it raised an `Exception` (`doing`: what the rank
    could not do, e.g. "could not fit its step cost"). `alone` (a one-process job: nobody
    waits) lets the exception raise as it is."""
    if alone:
        return work()
    try:
        return work()
    except Exception as e:  # noqa: BLE001 - carried to every rank, re-raised there
        return Failed(doing, cause_text(e), e, isinstance(e, CaramelError))


def cause_text(e: BaseException) -> str:
    """`"Type: message"`, at most about `CAUSE_CHARS` long; never raises (an exception whose
    `__str__` raised here would make the failing rank leave and its peers wait again)."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - the type alone still names the cause
        text = "<message could not be shown>"
    if len(text) > CAUSE_CHARS:
        text = text[:CAUSE_CHARS] + f"... ({len(text) - CAUSE_CHARS} more characters)"
    return f"{type(e).__name__}: {text}"


def raise_failed(what: str, gathered: Sequence[Any] | Mapping[int, Any], rank: int, mine: Any = None,
                 ranks: Sequence[int] | None = None) -> None:
    """Raises `RankFailedError` (`RankInputError` for a `CaramelError`) for the lowest rank whose
    entry of `gathered` (index or key: the group rank that sent it) is `Failed`, e.g. "balance:
    rank 1 could not fit its step cost: ValueError: ..."; on that rank (`rank`, whose own marker
    is `mine`: the gathered copy lost the exception) chained to its exception. `ranks`: the
    group's global ranks by group rank, named too where they differ. Returns when none failed."""
    items = sorted(gathered.items()) if isinstance(gathered, Mapping) else enumerate(gathered)
    for r, g in items:
        if isinstance(g, Failed):
            own = mine.error if r == rank and isinstance(mine, Failed) else None
            cls = RankInputError if g.bad_input else RankFailedError
            g_rank = r if ranks is None else ranks[r]
            who = f"rank {r}" if g_rank == r else f"group rank {r} (global rank {g_rank})"
            raise cls(f"{what}: {who} {g.doing}: {g.cause}") from own


def global_ranks(group: Any, world: int) -> list[int] | None:
    """`group`'s global ranks by group rank; None for the default group (the same numbers)."""
    if group is None or group is dist.group.WORLD:
        return None
    return [dist.get_global_rank(group, r) for r in range(world)]


def gather_failures(what: str, mine: Any, group: Any, world: int, rank: int) -> None:
    """Every rank of `group` (`world` of them) learns whether any rank's `mine` is `Failed`
    (one small all-gather) and raises it (`raise_failed`); returns on every rank when none is."""
    failures: list[Any] = [None] * world
    dist.all_gather_object(failures, mine if isinstance(mine, Failed) else None, group=group)
    raise_failed(what, failures, rank, mine, global_ranks(group, world))
