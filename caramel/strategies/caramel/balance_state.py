"""The balancers' checkpoint state: what `balance="batch"` and `balance="dropout"` have learned.

Both decide from each rank's moving window of compute times, every `balance_every` steps, so a
run resumed without that state decides differently from one never stopped: `dropout` restarts
its confirmation (a real slowdown waits two more decisions), its mask step (other masks) and its
fractions (undropped); `batch` restarts its windows, its last fitted fixed cost and its shares.
This state travels in the optimizer's `state_dict()` (the `caramel_adaptive` entry,
`caramel.runtime.optimizer`) and comes back with `load_state_dict()`:

- `shared`: what every rank holds alike (the steps counted, the fractions or the share
  schedule, the confirmation's last proposal, the changes so far, batch's reversal proposed once
  and its settling: decisions held in a row, the medians frozen at, and while frozen the
  decisions in a row proposing one move);
- `ranks`: rank -> its own window (and fixed cost). `optimizer.state_dict()` on one rank
  holds that rank's; `caramel train` gathers every rank's into the one checkpoint it writes
  (`merge_rank_states`). A rank whose entry is missing (a checkpoint one rank saved for all)
  starts its window empty: its next decision rests on fewer steps, the rest is exact.

The entry is versioned (`VERSION`): a checkpoint without it (saved before it existed) loads
with the balancer starting afresh, as it always did; a newer version, another balance mode or
another world size is refused with one error.
"""
from __future__ import annotations

import collections
from typing import Any

from caramel.errors import CaramelError
from caramel.strategies.caramel.balance import FIT_SIZES

VERSION = 1


def balancer_state(balancer: Any, rank: int, world: int) -> dict[str, Any]:
    """The state of a `Balancer` or `DropoutBalancer` (module docstring); plain lists and numbers."""
    kind = _kind(balancer)
    if kind == "dropout":
        shared = {"step": balancer.step, "fractions": list(balancer.fractions),
                  "last_proposal": None if balancer.confirmation.last is None else list(balancer.confirmation.last),
                  "changes": list(balancer.changes)}
        own = {"times": list(balancer.times)}
    else:
        schedule = balancer.schedule if balancer.schedule is not None else balancer.pending_schedule
        shared = {"steps": balancer._steps, "changes": list(balancer.changes),
                  "pending_reversal": balancer.pending_reversal,
                  "held_decisions": balancer.held_decisions, "frozen_s": balancer.frozen_s,
                  "drifted_decisions": balancer.drifted_decisions,
                  "schedule": schedule.state_dict() if hasattr(schedule, "state_dict") else schedule}
        own = {"times": [[n, list(q)] for n, q in balancer.times.items()], "fixed_s": balancer.fixed_s}
    return {"version": VERSION, "kind": kind, "world": world, "shared": shared, "ranks": {rank: own}}


def load_balancer_state(balancer: Any, state: dict[str, Any], rank: int, world: int, where: str = "checkpoint") -> None:
    """Restore what `balancer_state` saved (every rank calls it with the same `state`)."""
    kind = _kind(balancer)
    version = state.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CaramelError(f"{where}: balancer state version {version!r} is newer than this caramel reads ({VERSION}); "
                           "resume with the caramel that saved it")
    if state.get("kind") != kind:
        raise CaramelError(f"{where}: the checkpoint holds balance={state.get('kind')!r} state, this run has "
                           f"balance={kind!r}; resume with the same balance option")
    if state.get("world") != world:
        raise CaramelError(f"{where}: the balancer state is for {state.get('world')} ranks, this job has {world}")
    shared, own = state["shared"], _own(state, rank)
    if kind == "dropout":
        balancer.step = int(shared["step"])
        balancer.confirmation.last = None if shared["last_proposal"] is None else list(shared["last_proposal"])
        balancer.changes = list(shared["changes"])
        balancer.times.clear()
        balancer.times.extend(float(t) for t in own.get("times", []))
        balancer.set_fractions(list(shared["fractions"]))  # draws the next step's masks at the restored step
        return
    balancer._steps = int(shared["steps"])
    balancer.changes = list(shared["changes"])
    balancer.pending_reversal = _reversal(shared.get("pending_reversal"), world, where)  # absent before: none
    _settling(balancer, shared, world, where)  # absent before the settling rule: not settled
    balancer.fixed_s = own.get("fixed_s")
    balancer.times.clear()
    # an older controller kept more sizes; the fit runs over the last FIT_SIZES, also right after a resume
    for n, ts in own.get("times", [])[-FIT_SIZES:]:
        balancer.times[int(n)] = collections.deque((float(t) for t in ts), maxlen=balancer.window_steps)
    if shared["schedule"] is not None:
        balancer.restore_schedule(shared["schedule"])


def merge_rank_states(states: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One entry holding every rank's own part (`caramel train` gathers each rank's entry)."""
    present = [s for s in states if s]
    if not present:
        return None
    out = dict(present[0])
    out["ranks"] = {r: own for s in present for r, own in s.get("ranks", {}).items()}
    return out


def _reversal(value: Any, world: int, where: str) -> list[int] | None:
    """`pending_reversal` as saved: None, or one sign (-1, 0, 1) per rank; anything else is refused."""
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != world
            or any(type(v) is not int or v not in (-1, 0, 1) for v in value)):
        raise CaramelError(f"{where}: pending_reversal is {value!r}; expected None or a list of {world} "
                           "signs, each -1, 0 or 1")
    return list(value)


def _settling(balancer: Any, shared: dict[str, Any], world: int, where: str) -> None:
    """`held_decisions`, `frozen_s`, `drifted_decisions` as saved (0, None, 0 when absent); checked."""
    held, drifted, frozen = shared.get("held_decisions", 0), shared.get("drifted_decisions", 0), shared.get("frozen_s")
    for name, value in (("held_decisions", held), ("drifted_decisions", drifted)):
        if type(value) is not int or value < 0:
            raise CaramelError(f"{where}: {name} is {value!r}; expected a count (an int >= 0)")
    if frozen is not None and (not isinstance(frozen, (list, tuple)) or len(frozen) != world
                               or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in frozen)):
        raise CaramelError(f"{where}: frozen_s is {frozen!r}; expected None or {world} median compute times "
                           "(seconds, >= 0)")
    balancer.held_decisions, balancer.drifted_decisions = held, drifted
    balancer.frozen_s = None if frozen is None else [float(v) for v in frozen]


def _own(state: dict[str, Any], rank: int) -> dict[str, Any]:
    ranks = state.get("ranks", {})
    return ranks.get(rank, ranks.get(str(rank), {}))


def _kind(balancer: Any) -> str:
    return "dropout" if hasattr(balancer, "confirmation") else "batch"
