"""`Session`: the engines parallelized in one process, and the names of their private groups.

Two things need a view wider than one `parallelize` call. `caramel.shutdown()`, and the exit
handler that calls it, must find every live engine to release its private groups while the
interpreter is intact (gloo's threads are joined then, not during teardown). And each engine's
private groups need store names that are the same on every rank and never reused in the
process. Both are kept on one object that is created explicitly and passed down
(`parallelize(..., session=...)`), not in hidden module counters: `caramel.strategies.api`
makes the default one, registers its shutdown at exit, and passes it to every strategy; a test
or an embedding program can pass its own and shut it down itself.

Names: `<kind>-<parent>-<model>-<n>`, from a digest of the parent group's global ranks, the
model's fingerprint and a count of models parallelized on that parent group in this session.
Every rank of the parent makes the same `parallelize` calls in the same order (the start-up
check fails otherwise), so every rank derives the same names; two subgroups never share one.
"""
from __future__ import annotations

import gc
import hashlib
import weakref
from typing import Any

import torch.distributed as dist


class Session:
    """Live engines and per-parent-group name sequences (module docstring)."""

    def __init__(self) -> None:
        self._engines: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._models_on: dict[str, int] = {}  # parent group's digest -> models parallelized on it

    def group_prefix(self, parent: Any, fingerprint: str) -> str:
        """A new name stem for one model's private groups over `parent`'s ranks (same on every rank)."""
        ranks = dist.get_process_group_ranks(parent or dist.group.WORLD)
        digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:8]
        n = self._models_on.get(digest, 0) + 1
        self._models_on[digest] = n
        return f"{digest}-{fingerprint[:12]}-{n}"

    def register(self, engine: Any) -> None:
        """`engine.release()` runs at `shutdown()` unless the engine is gone by then."""
        self._engines.add(engine)

    def live_engines(self) -> list[Any]:
        return list(self._engines)

    def shutdown(self) -> None:
        """Release the private groups of every live engine of this session (pending updates are
        applied first; a model used afterwards raises an error naming it). Idempotent."""
        for engine in list(self._engines):
            engine.release()
        gc.collect()
