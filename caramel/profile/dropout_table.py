"""The cost-versus-accuracy table of structured dropout, measured offline per model.

`caramel profile --model M --dropout-table OUT` writes JSON `caramel.dropout-table/1`:

    {"format": "caramel.dropout-table/1", "model": "mlp", "groups": ["layers.0", ...],
     "batch_size": 64, "train_steps": 30,
     "entries": [{"fraction": 0.0, "time_ratio": 1.0, "val_loss": 2.31, "loss_increase": 0.0}, ...]}

Each entry drops the same fraction of the units of every droppable group
(`caramel.profile.dropout_groups`). `time_ratio` is the median forward + backward time with
that drop over the time without (fresh random masks each step); `val_loss` is the loss on a
held-out batch, without drop, of a copy trained `train_steps` SGD steps with that drop from
the same start, and `loss_increase` its difference from the fraction-0 entry. `choose` picks,
for a rank `slowness` times slower than the fastest, the entry of least loss increase whose
time ratio brings it down to the fastest; when none does, the fastest entry.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from caramel.errors import CaramelError
from caramel.jsonio import write_json
from caramel.profile.dropout_groups import Narrowing, find_groups
from caramel.stats import median

FORMAT = "caramel.dropout-table/1"
DEFAULT_FRACTIONS = (0.0, 0.125, 0.25, 0.5)


@dataclasses.dataclass(frozen=True)
class Entry:
    fraction: float
    time_ratio: float
    val_loss: float
    loss_increase: float


@dataclasses.dataclass(frozen=True)
class DropoutTable:
    model: str
    groups: list[str]
    entries: list[Entry]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "model": self.model, "groups": list(self.groups), **self.meta,
                "entries": [dataclasses.asdict(e) for e in self.entries]}

    def save(self, path: str | os.PathLike) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DropoutTable":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise CaramelError(f"dropout table {path}: cannot read it as JSON ({e})") from e
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str = "dropout table") -> "DropoutTable":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CaramelError(f"{where}: expected a JSON object with \"format\": \"{FORMAT}\" "
                               f"(caramel profile --dropout-table), got format {_get(data, 'format')!r}")
        groups, raw = data.get("groups"), data.get("entries")
        if not isinstance(groups, list) or not groups or not all(isinstance(g, str) for g in groups):
            raise CaramelError(f"{where}: \"groups\" must be a non-empty list of module names, got {groups!r}")
        if not isinstance(raw, list) or not raw:
            raise CaramelError(f"{where}: \"entries\" must be a non-empty list, got {raw!r}")
        entries = []
        for i, e in enumerate(raw):
            try:
                entry = Entry(*(float(e[k]) for k in ("fraction", "time_ratio", "val_loss", "loss_increase")))
            except (TypeError, KeyError, ValueError) as err:
                raise CaramelError(f"{where}: entries[{i}] needs numbers fraction, time_ratio, val_loss and "
                                   f"loss_increase ({type(err).__name__}: {err})") from err
            if not 0.0 <= entry.fraction < 1.0:
                raise CaramelError(f"{where}: entries[{i}].fraction must be in [0, 1), got {entry.fraction}")
            if not (math.isfinite(entry.time_ratio) and entry.time_ratio > 0):
                raise CaramelError(f"{where}: entries[{i}].time_ratio must be a number > 0, got {entry.time_ratio}")
            if not (math.isfinite(entry.val_loss) and math.isfinite(entry.loss_increase)):
                raise CaramelError(f"{where}: entries[{i}] val_loss and loss_increase must be finite numbers")
            entries.append(entry)
        if not any(e.fraction == 0.0 for e in entries):
            raise CaramelError(f"{where}: needs an entry with fraction 0 (the undropped model)")
        meta = {k: v for k, v in data.items() if k not in ("format", "model", "groups", "entries")}
        return cls(str(data.get("model", "")), list(groups), entries, meta)

    def check_groups(self, found: list[str], where: str = "dropout table") -> None:
        if list(found) != list(self.groups):
            raise CaramelError(f"{where} was measured for groups {self.groups}, this model's droppable groups are "
                               f"{list(found)}; measure it for this model with caramel profile --dropout-table")

    def ratio(self, fraction: float) -> float:
        """The time ratio of the entry with this fraction (1.0 for 0)."""
        return next((e.time_ratio for e in self.entries if e.fraction == fraction), 1.0)

    def choose(self, slowness: float) -> Entry:
        """The entry for a rank `slowness` (>= 1) times slower than the fastest (module docstring)."""
        fit = [e for e in self.entries if e.time_ratio * slowness <= 1.0]
        if fit:
            return min(fit, key=lambda e: (e.loss_increase, e.fraction))
        return min(self.entries, key=lambda e: (e.time_ratio, e.loss_increase))


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else type(data).__name__


def random_kept(units: int, fraction: float, gen: torch.Generator) -> torch.Tensor | None:
    """The sorted indices of the units kept when dropping `fraction` of `units` (None: all kept);
    at least one unit is always kept."""
    drop = min(int(round(fraction * units)), units - 1)
    if drop <= 0:
        return None
    return torch.randperm(units, generator=gen)[: units - drop].sort().values


def measure_table(model_name: str, factory: Callable[..., Any], batch_size: int | None,
                  fractions: tuple[float, ...] = DEFAULT_FRACTIONS, time_steps: int = 5, train_steps: int = 30,
                  lr: float = 0.05, seed: int = 0) -> DropoutTable:
    """Measure the table for a zoo model (or a `path:factory`): the factory's batch trains,
    the batch of seed + 1 is held out (module docstring)."""
    kw = {} if batch_size is None else {"batch_size": batch_size}
    mb, held = factory(seed=seed, **kw), factory(seed=seed + 1, **kw)
    groups = find_groups(mb.model)
    base = copy.deepcopy(mb.model)
    gen = torch.Generator().manual_seed(seed)
    times: dict[float, list[float]] = {f: [] for f in fractions}
    losses = {}
    timed = {f: copy.deepcopy(base) for f in fractions}
    narrows = {f: Narrowing(find_groups(m)) for f, m in timed.items()}
    # the fractions take turns, one step each per round, so the host's load falls on all alike
    for _ in range(time_steps + 1):
        for f in fractions:
            m = timed[f]
            narrows[f].set_kept({g.name: random_kept(g.units, f, gen) for g in groups})
            t0 = time.perf_counter()
            mb.loss_fn(m(mb.inputs), mb.targets).backward()
            times[f].append(time.perf_counter() - t0)
            m.zero_grad(set_to_none=True)
    times = {f: median(t[1:]) for f, t in times.items()}
    for f in fractions:
        m = copy.deepcopy(base)
        narrow = Narrowing(find_groups(m))
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        for _ in range(train_steps):
            narrow.set_kept({g.name: random_kept(g.units, f, gen) for g in groups})
            opt.zero_grad(set_to_none=True)
            mb.loss_fn(m(mb.inputs), mb.targets).backward()
            opt.step()
        narrow.set_kept({})
        m.eval()
        with torch.no_grad():
            losses[f] = float(held.loss_fn(m(held.inputs), held.targets))
    t0, l0 = times.get(0.0, times[min(times)]), losses.get(0.0, losses[min(losses)])
    entries = [Entry(f, times[f] / t0, losses[f], losses[f] - l0) for f in fractions]
    return DropoutTable(model_name, [g.name for g in groups], entries,
                        {"batch_size": int(mb.inputs.shape[0]), "train_steps": train_steps, "time_steps": time_steps,
                         "lr": lr, "threads": torch.get_num_threads()})


def check_fractions(text: str) -> tuple[float, ...]:
    """`--dropout-fractions 0,0.125,0.25,0.5` -> a tuple holding 0; one clear error otherwise."""
    try:
        out = tuple(float(x) for x in str(text).split(","))
    except ValueError:
        out = ()
    if not out or any(not 0.0 <= f < 1.0 for f in out):
        raise CaramelError(f"--dropout-fractions {text!r}: expected comma-separated fractions in [0, 1), e.g. 0,0.25,0.5")
    return out if 0.0 in out else (0.0,) + out
