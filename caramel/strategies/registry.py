"""One registry of strategies: name -> options class, runtime entry point and simulator model.

A strategy is a way to keep workers' models in step. Each registers a `StrategyInfo`; its
runtime and simulator model are named as `module:function` and imported on first use, so the
command line lists and validates strategies without loading torch's distributed stack.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from caramel.errors import CaramelError
from caramel.strategies.options import build_options, parse_spec, to_spec, unknown_name_error


@dataclass(frozen=True)
class StrategyInfo:
    """`parallelize(model, optimizer, options, **common)` returns (model, optimizer);
    `simulate(profile, cluster, options, iterations)` returns a `caramel.sim.SimResult`."""

    name: str
    options: type
    parallelize: str
    simulate: str
    summary: str
    records_trace: bool = False  # its runtime takes `trace=PATH` and writes a timeline there

    def runtime(self) -> Callable[..., Any]:
        return _resolve(self.parallelize)

    def simulator(self) -> Callable[..., Any]:
        return _resolve(self.simulate)


@dataclass(frozen=True)
class StrategySpec:
    """A strategy and its typed options, parsed from `NAME[:key=value,...]` or keywords."""

    info: StrategyInfo
    options: Any

    @property
    def name(self) -> str:
        """The canonical spelling: options that differ from their defaults, sorted."""
        return to_spec(self.info.name, self.options)

    def simulate(self, profile: Any, cluster: Any, iterations: int = 4) -> Any:
        """This strategy with these options in its simulator model (a `caramel.sim.SimResult`)."""
        return self.info.simulator()(profile, cluster, self.options, iterations=iterations)


def _resolve(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry:
    """Strategies by name; `ps`, `gossip` and later strategies `register` here."""

    def __init__(self) -> None:
        self._by_name: dict[str, StrategyInfo] = {}

    def register(self, info: StrategyInfo) -> StrategyInfo:
        if info.name in self._by_name:
            raise ValueError(f"strategy {info.name!r} registered twice")
        self._by_name[info.name] = info
        return info

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> StrategyInfo:
        if name not in self._by_name:
            raise unknown_name_error("strategy", name, self.names())
        return self._by_name[name]

    def spec(self, text_or_name: str, values: dict[str, Any] | None = None) -> StrategySpec:
        """`"caramel:overlap=forward"` (text options parsed by each field's type), plus keyword
        `values`; the same option given both ways is an error."""
        name, from_text = parse_spec(text_or_name)
        info = self.get(name)
        both = set(from_text) & set(values or {})
        if both:
            raise _twice(text_or_name, both)
        merged = {**from_text, **(values or {})}
        return StrategySpec(info, build_options(info.options, merged, where=f"strategy {info.name!r}"))


def _twice(text: str, keys: set[str]) -> CaramelError:
    return CaramelError(f"strategy {text!r}: option {', '.join(sorted(keys))} given both in the name and as a keyword")
