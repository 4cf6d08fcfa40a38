"""Versioned JSON files: every file Caramel writes says what it is (`"format": "caramel.<kind>/1"`).

Writes are atomic (temporary file in the same directory, then rename), so a reader never
sees half a file, and a crash leaves the previous version in place.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from caramel.errors import FormatError

FORMAT_VERSION = 1


def format_tag(kind: str) -> str:
    """The `format` value for a file of this kind, e.g. `caramel.plan/1`."""
    return f"caramel.{kind}/{FORMAT_VERSION}"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one
    (a temporary file beside it, flushed to disk, then renamed; removed on any failure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write a dict (which must carry its `format`) as pretty, key-sorted JSON, atomically."""
    assert "format" in data, "every Caramel file carries its format tag"
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def check_format(data: Any, kind: str, source: str = "<data>", versions: tuple[int, ...] = (FORMAT_VERSION,)) -> dict[str, Any]:
    """Check that `data` is a dict tagged `caramel.<kind>/<v>`, v among `versions` (1 unless a
    kind says otherwise); return it."""
    if not isinstance(data, dict):
        raise FormatError(f"{source}: expected a JSON object with \"format\": \"{format_tag(kind)}\", got {type(data).__name__}")
    tag = data.get("format")
    tags = [f"caramel.{kind}/{v}" for v in versions]
    if tag not in tags:
        if isinstance(tag, str) and tag.startswith(f"caramel.{kind}/"):
            expected = " or ".join(map(repr, tags))
            raise FormatError(f"{source}: format {tag!r} is not supported by this version (expected {expected})")
        raise FormatError(f"{source}: expected \"format\": \"{format_tag(kind)}\", found {tag!r} (is this a Caramel {kind} file?)")
    return data


def read_json(path: str | os.PathLike, kind: str, versions: tuple[int, ...] = (FORMAT_VERSION,)) -> dict[str, Any]:
    """Read and check a Caramel JSON file of the given kind; clear errors for missing, truncated or foreign files."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file (expected a Caramel {kind} JSON file)") from None
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory (expected a Caramel {kind} JSON file)") from None
    except UnicodeDecodeError:
        raise FormatError(f"{path}: not a text file (expected a Caramel {kind} JSON file)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); the file may be truncated") from None
    return check_format(data, kind, str(path), versions)


def require(data: dict[str, Any], key: str, typ: type | tuple[type, ...], source: str) -> Any:
    """Fetch `data[key]`, checking presence and type, with an error naming the field."""
    if key not in data:
        raise FormatError(f"{source}: missing field {key!r}")
    value = data[key]
    if isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise FormatError(f"{source}: field {key!r} must be {_typename(typ)}, got a boolean")
    if not isinstance(value, typ):
        raise FormatError(f"{source}: field {key!r} must be {_typename(typ)}, got {type(value).__name__}")
    return value


def _typename(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def require_mapping(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """An optional object-valued field (e.g. `meta`): {} when absent, FormatError when not an object."""
    value = data.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FormatError(f"{source}: field {key!r} must be an object, got {type(value).__name__}")
    return dict(value)


def require_number(data: dict[str, Any], key: str, source: str, default: float | None = None,
                   minimum: float | None = None) -> float:
    """A finite number field (ints accepted), optionally with a default and a lower bound."""
    import math
    if key not in data and default is not None:
        return default
    value = require(data, key, (int, float), source)
    if not math.isfinite(value):
        raise FormatError(f"{source}: field {key!r} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise FormatError(f"{source}: field {key!r} must be >= {minimum:g}, got {value!r}")
    return value


def _matches(value: Any, hint: Any) -> bool:
    import types
    import typing
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        (inner,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_matches(v, inner) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if origin is tuple:
        return isinstance(value, (list, tuple))
    if hint is float:
        import math
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def from_fields(cls: type, raw: Any, source: str) -> Any:
    """Build dataclass `cls` from a JSON object, checking every field's type against the
    annotations, so that a malformed entry is a FormatError naming the field."""
    import dataclasses
    import typing
    if not isinstance(raw, dict):
        raise FormatError(f"{source} must be an object, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise FormatError(f"{source} has an unknown field {unknown[0]!r}")
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise FormatError(f"{source}.{name} is missing")
            continue
        if not _matches(raw[name], hints[name]):
            raise FormatError(f"{source}.{name} must be {_describe(hints[name])}, got {raw[name]!r:.60}")
    return cls(**raw)


def _describe(hint: Any) -> str:
    import types
    import typing
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if origin is list:
        (inner,) = typing.get_args(hint) or (Any,)
        return f"a list of {_describe(inner).removeprefix('a ').removeprefix('an ')}s" if inner is not Any else "a list"
    names = {float: "a finite number", int: "an integer", str: "a string", bool: "true or false",
             type(None): "null", dict: "an object"}
    return names.get(hint, names.get(origin, getattr(hint, "__name__", str(hint))))
