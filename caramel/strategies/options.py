"""Typed strategy options: one parser for `NAME[:key=value,...]`, one value parser, and errors
that name the nearest valid option.

Each strategy declares its knobs as a dataclass (`CaramelOptions`, `DdpOptions`, ...). Options
arrive as Python keywords (`parallelize(..., overlap="forward")`) or as text (`caramel
train --strategy caramel:overlap=forward`, `caramel bench --strategies ...`); both go through
`build_options`, so the same names, types and errors hold everywhere. A field's `metadata` may
name its `choices`; anything a type check cannot say is checked in the class's `__post_init__`.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import Any, Mapping, TypeVar

from caramel.errors import CaramelError

T = TypeVar("T")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_value(text: str) -> bool | int | float | str:
    """`true`/`false` -> bool, then int, then float, else the text itself (stripped)."""
    text = text.strip()
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def format_value(value: Any) -> str:
    """The inverse of `parse_value` for the values it returns (`True` -> `true`, `0.5` -> `0.5`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_spec(text: str) -> tuple[str, dict[str, Any]]:
    """`name:key=value,key=value` -> (name, {key: parsed value}); syntax errors name the text."""
    text = text.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise CaramelError(f"strategy {text!r}: expected NAME[:key=value,...] (e.g. caramel:overlap=forward)")
    options: dict[str, Any] = {}
    for item in rest.split(",") if rest else []:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value or not _KEY.fullmatch(key):
            raise CaramelError(f"strategy {text!r}: option {item!r} is not key=value (e.g. overlap=forward)")
        if key in options:
            raise CaramelError(f"strategy {text!r}: option {key!r} given twice")
        # a value may hold a ':' (consistency=ssp:2, compression=topk:0.01); one holding a
        # ':' and then another key=value is options joined by ':' instead of ','
        if ":" in value and "=" in value:
            raise CaramelError(f"strategy {text!r}: option {key}={value!r} holds a ':'; options are separated by "
                               f"commas (e.g. caramel:planner=fifo,overlap=backward)")
        options[key] = parse_value(value)
    return name, options


def nearest(name: str, valid: list[str] | tuple[str, ...]) -> str | None:
    """The valid name closest to a misspelled one, if any is close."""
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_name_error(what: str, name: str, valid: list[str] | tuple[str, ...], where: str = "") -> CaramelError:
    """`unknown option 'overlpa'; did you mean 'overlap'?` (with the valid names when none is close)."""
    close = nearest(name, valid)
    hint = f"; did you mean {close!r}?" if close else f"; expected one of {', '.join(sorted(valid))}"
    return CaramelError(f"{where}unknown {what} {name!r}{hint}")


def option_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def build_options(cls: type[T], values: Mapping[str, Any], where: str = "") -> T:
    """An instance of the options dataclass `cls` from `values`: every key must be a field
    (else an error naming the nearest one), every value of the field's type (ints widen to
    floats; `parse_spec` has already parsed text from the command line) and among its choices."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    prefix = f"{where}: " if where else ""
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise unknown_name_error("option", key, list(fields), prefix)
        kwargs[key] = _check_type(key, value, hints[key], fields[key].metadata.get("choices"), prefix)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CaramelError(f"{prefix}{e}") from None


def _check_type(key: str, value: Any, hint: Any, choices: tuple | None, prefix: str) -> Any:
    allowed = _types_of(hint)
    if choices is not None and not (value is None and type(None) in allowed):
        if not any(value == c and type(value) is type(c) for c in choices):
            raise CaramelError(f"{prefix}option {key} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if isinstance(value, int) and not isinstance(value, bool) and float in allowed and int not in allowed:
        value = float(value)
    ok = any(value is None if t is type(None) else (isinstance(value, t) and (t is bool or not isinstance(value, bool)))
             for t in allowed)
    if not ok:
        names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
        raise CaramelError(f"{prefix}option {key} must be {names}, got {value!r}")
    return value


def _types_of(hint: Any) -> tuple[type, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for arg in typing.get_args(hint) for t in _types_of(arg))
    if hint is Any:
        return (object,)
    origin = typing.get_origin(hint)
    return (origin if origin is not None else hint,)


def to_spec(name: str, options: Any) -> str:
    """The canonical `name:key=value,...` of an options object: only the fields that differ
    from their defaults, sorted, so that equal configurations print alike."""
    changed = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
               if f.init and getattr(options, f.name) != _default(f)}
    if not changed:
        return name
    return name + ":" + ",".join(f"{k}={format_value(v)}" for k, v in sorted(changed.items()))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def check_same_everywhere(name: str, options: Any, shapes: list, group: Any, shapes_word: str = "parameters") -> None:
    """Every rank of `group` must run strategy `name` with the same options on the same
    parameter `shapes` (else collectives would pair up wrongly or wait forever): one clear
    `MismatchError` on every rank, naming the ranks and what differs (options or `shapes_word`)."""
    import torch.distributed as dist

    from caramel.errors import MismatchError

    mine = (to_spec(name, options), shapes)
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differ:
        what = "options" if any(everyone[r][0] != everyone[0][0] for r in differ) else shapes_word
        raise MismatchError(f"strategy '{name}': ranks {differ} have other {what} than rank 0 "
                            f"({everyone[differ[0]][0]} vs {everyone[0][0]}); every rank must parallelize the same "
                            f"model with the same options")
