"""What one fault experiment found, and the registry of experiments.

Each fault class lives in its own module and registers its experiments here with `@fault(...)`;
`experiments.faults.matrix` runs them and renders the table. An experiment returns a `FaultResult`
whose `passed` says whether Caramel behaved as promised (detected, within the limit, with a
message that names what happened, nothing lost that should not be), measured, never assumed.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


@dataclass
class MatrixConfig:
    """Knobs shared by every experiment."""

    timeout_s: float = 10.0  # CARAMEL_TIMEOUT_S for the jobs: how long a silent peer is waited for
    kill_limit_s: float = 60.0  # a dead peer must be noticed within this (issue 7)
    seed: int = 0  # picks the step at which faults land
    include_slow: bool = True  # the torchrun-restart and emulated-cluster experiments (minutes)


@dataclass
class FaultResult:
    fault: str  # registry name
    category: str  # process, disagreement, storage, restart, network
    injected: str  # what was done, with where and when
    expected: str  # what Caramel promises
    detected: bool | None  # None: not applicable (a fault that needs no detection, e.g. a slower link)
    detect_s: float | None  # from injection to the last affected rank's exit (or the error)
    exit_codes: list[int | None]
    message: str  # the error line the user sees (first one that names the fault)
    recovered: str  # "yes", "no", "n/a", with a reason
    data_lost: str  # what work was lost, in steps
    passed: bool
    notes: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FaultFn = Callable[[MatrixConfig], FaultResult]
# name -> (category, function, slow)
FAULTS: dict[str, tuple[str, FaultFn, bool]] = {}


def fault(name: str, category: str, slow: bool = False) -> Callable[[FaultFn], FaultFn]:
    """Register an experiment under `name`."""
    def deco(fn: FaultFn) -> FaultFn:
        assert name not in FAULTS, f"fault {name!r} registered twice"
        FAULTS[name] = (category, fn, slow)
        return fn
    return deco


_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s?")
_ERROR_LINE = re.compile(r"(?:\w+Error|\w+Exception|error):")


def error_line(stderr: str) -> str:
    """The last line of a worker's stderr that states an error (without torch's `[rankN]:` prefix)."""
    lines = [_PREFIX.sub("", line).strip() for line in stderr.splitlines()]
    hits = [line for line in lines if _ERROR_LINE.search(line)]
    return hits[-1] if hits else (lines[-1] if lines else "")


def shorten(text: str, max_chars: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
