"""Find and remove what dead emulated clusters left behind (`caramel cluster list` / `cleanup`).

A cluster's objects are removed here only when its state file says it created them *and* its
owner process is gone (pid absent, or reused by a process with another start time). Objects
that carry our naming pattern but have no state file are listed as orphans and left alone:
without the record we cannot prove they are ours.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.cluster import netns
from caramel.cluster.state import ClusterState, StateStore

_NAME_RE = re.compile(r"(crm[0-9a-f]{6})(?:br|h\d+|-[a-z0-9]+)")


@dataclass
class ClusterRecord:
    """One cluster seen on the host: from its state file, from names on the host, or both."""

    prefix: str
    status: str  # "running" (owner alive), "dead" (owner gone), "orphan" (no state file)
    pid: int | None = None
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    state_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def inventory(state_dir: str) -> tuple[list[ClusterRecord], list[str]]:
    """Every Caramel cluster on this host, and messages about unreadable state files."""
    store = StateStore(state_dir)
    states, problems = store.load_all()
    present_ns = netns.list_netns()
    present_links = netns.list_links()
    etc_dirs = sorted(os.listdir(netns.ETC_NETNS)) if os.path.isdir(netns.ETC_NETNS) else []
    records: dict[str, ClusterRecord] = {}
    for s in states:
        records[s.prefix] = ClusterRecord(s.prefix, "running" if s.owner_alive() else "dead", pid=s.pid,
                                          state_file=str(store.path(s.prefix)))
    for name in present_ns + etc_dirs:
        m = _NAME_RE.fullmatch(name)
        if m:
            rec = records.setdefault(m.group(1), ClusterRecord(m.group(1), "orphan"))
            if name in present_ns and name not in rec.namespaces:
                rec.namespaces.append(name)
    for name in present_links:
        m = _NAME_RE.fullmatch(name)
        if m:
            records.setdefault(m.group(1), ClusterRecord(m.group(1), "orphan")).links.append(name)
    return sorted(records.values(), key=lambda r: r.prefix), problems


def cleanup_dead(state_dir: str, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Remove the recorded objects of every cluster whose owner is gone.

    Returns (prefixes cleaned, problems). Running clusters and orphans are never touched.
    """
    store = StateStore(state_dir)
    cleaned, problems = [], []
    with store.locked():
        states, bad = store.load_all()
        problems.extend(bad)
        for s in states:
            if s.owner_alive():
                continue
            if not dry_run:
                failed = netns.destroy(s.resources)
                if failed:
                    problems.extend(f"{s.prefix}: {msg}" for msg in failed)
                    continue
                store.remove(s.prefix)
            cleaned.append(s.prefix)
    return cleaned, problems


def dead_states(state_dir: str) -> list[ClusterState]:
    """State of clusters whose owner is gone (for tests and reports)."""
    states, _ = StateStore(state_dir).load_all()
    return [s for s in states if not s.owner_alive()]
