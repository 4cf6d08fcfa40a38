"""A knob space: named knobs with finite choices, their product as the candidate list, and an
embedding (numbers on a log or linear unit scale, categories one-hot) that the search clusters
candidates in."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

from caramel.errors import CaramelError

Config = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    name: str
    choices: tuple[Any, ...]
    log: bool = False  # numeric choices spaced on a log scale (bucket sizes)

    def __post_init__(self) -> None:
        if not self.choices:
            raise CaramelError(f"knob {self.name!r} has no choices")

    @property
    def numeric(self) -> bool:
        return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in self.choices)

    def embed(self, value: Any) -> list[float]:
        if self.numeric:
            f = (lambda v: math.log(v)) if self.log else float
            lo, hi = min(map(f, self.choices)), max(map(f, self.choices))
            return [(f(value) - lo) / (hi - lo) if hi > lo else 0.0]
        return [1.0 if value == c else 0.0 for c in self.choices]


@dataclass(frozen=True)
class Space:
    knobs: tuple[Knob, ...]

    def candidates(self) -> list[Config]:
        """Every combination, in a fixed order."""
        names = [k.name for k in self.knobs]
        return [dict(zip(names, values)) for values in itertools.product(*(k.choices for k in self.knobs))]

    def embed(self, config: Config) -> list[float]:
        return [x for k in self.knobs for x in k.embed(config[k.name])]

    def key(self, config: Config) -> tuple:
        return tuple(config[k.name] for k in self.knobs)


def parse_space(items: Sequence[str]) -> Space:
    """`name=a|b|c` strings to a Space (numbers parsed; `log:` before the choices puts them on a log scale)."""
    knobs = []
    for item in items:
        name, eq, rest = item.partition("=")
        if not eq or not name.strip() or not rest.strip():
            raise CaramelError(f"--knob {item!r}: expected NAME=a|b|c, e.g. bucket_cap_mb=log:1|5|25")
        log = rest.startswith("log:")
        choices = tuple(_value(v) for v in rest.removeprefix("log:").split("|") if v.strip())
        knob = Knob(name.strip(), choices, log)
        if log and not (knob.numeric and all(c > 0 for c in choices)):
            raise CaramelError(f"--knob {item!r}: log: needs positive numbers")
        knobs.append(knob)
    return Space(tuple(knobs))


def _value(text: str) -> Any:
    text = text.strip()
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)
