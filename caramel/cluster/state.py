"""Per-cluster state files: who owns a cluster and exactly what it created.

One versioned JSON file per cluster (`<state_dir>/<prefix>.json`, format `caramel.cluster-state/1`)
records the owner (pid and the pid's start time, so a recycled pid is not mistaken for the
owner), the subnet, and every namespace and link, *before* each is created. `caramel cluster
cleanup` uses these files to remove leftovers of clusters whose owner died (e.g. SIGKILL), and
nothing else.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from caramel.errors import CaramelError, FormatError
from caramel.jsonio import check_format, format_tag, read_json, require, write_json

KIND = "cluster-state"


def pid_start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (field 22 of /proc/pid/stat), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] == "Z":  # a zombie has exited; only its parent has not reaped it yet
        return None
    return int(fields[19])


@dataclass
class ClusterState:
    """What one cluster owns. `resources` is in creation order: `{"kind": "netns"|"link"|"etc", "name"}`."""

    prefix: str
    pid: int
    pid_start: int | None
    subnet_index: int
    workers: int
    bandwidth_bps: float
    created_at: float = field(default_factory=time.time)
    resources: list[dict[str, str]] = field(default_factory=list)

    def owner_alive(self) -> bool:
        start = pid_start_time(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = format_tag(KIND)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> "ClusterState":
        check_format(data, KIND, source)
        res = require(data, "resources", list, source)
        for r in res:
            if not (isinstance(r, dict) and r.get("kind") in ("netns", "link", "etc") and isinstance(r.get("name"), str)):
                raise FormatError(f"{source}: malformed resource entry {r!r}")
        return cls(
            prefix=require(data, "prefix", str, source),
            pid=require(data, "pid", int, source),
            pid_start=data.get("pid_start"),
            subnet_index=require(data, "subnet_index", int, source),
            workers=require(data, "workers", int, source),
            bandwidth_bps=require(data, "bandwidth_bps", (int, float), source),
            created_at=data.get("created_at", 0.0),
            resources=list(res),
        )


class StateStore:
    """The directory of state files, with a lock so that two clusters never pick the same subnet."""

    def __init__(self, state_dir: str):
        self.dir = Path(state_dir)

    def path(self, prefix: str) -> Path:
        return self.dir / f"{prefix}.json"

    def save(self, state: ClusterState) -> None:
        write_json(self.path(state.prefix), state.to_dict())

    def remove(self, prefix: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(prefix).unlink()

    def load_all(self) -> tuple[list[ClusterState], list[str]]:
        """All readable state files, and one message per unreadable one (never raises for a bad file)."""
        states, problems = [], []
        if not self.dir.is_dir():
            return states, problems
        for p in sorted(self.dir.glob("crm*.json")):
            try:
                states.append(ClusterState.from_dict(read_json(p, KIND), str(p)))
            except FormatError as e:
                problems.append(str(e))
        return states, problems

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def claim(self, prefix: str, workers: int, bandwidth_bps: float, host_used: set[int], num_subnets: int) -> ClusterState:
        """Pick a /24 that no live cluster and no host address uses, and write our state file, atomically."""
        with self.locked():
            states, _ = self.load_all()
            if any(s.prefix == prefix for s in states):
                raise CaramelError(f"cluster prefix {prefix!r} is already in use on this host (state file {self.path(prefix)})")
            used = set(host_used) | {s.subnet_index for s in states}
            free = [i for i in range(num_subnets) if i not in used]
            if not free:
                raise CaramelError("no free /24 left in 198.18.0.0/15 for another emulated cluster; run `caramel cluster cleanup`")
            state = ClusterState(prefix=prefix, pid=os.getpid(), pid_start=pid_start_time(os.getpid()),
                                 subnet_index=random.choice(free), workers=workers, bandwidth_bps=bandwidth_bps)
            self.save(state)
            return state
