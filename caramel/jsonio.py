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


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write a dict (which must carry its `format`) as pretty, key-sorted JSON, atomically."""
    assert "format" in data, "every Caramel file carries its format tag"
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def check_format(data: Any, kind: str, source: str = "<data>") -> dict[str, Any]:
    """Check that `data` is a dict tagged `caramel.<kind>/1`; return it."""
    if not isinstance(data, dict):
        raise FormatError(f"{source}: expected a JSON object with \"format\": \"{format_tag(kind)}\", got {type(data).__name__}")
    tag = data.get("format")
    if tag != format_tag(kind):
        if isinstance(tag, str) and tag.startswith(f"caramel.{kind}/"):
            raise FormatError(f"{source}: format {tag!r} is not supported by this version (expected {format_tag(kind)!r})")
        raise FormatError(f"{source}: expected \"format\": \"{format_tag(kind)}\", found {tag!r} (is this a Caramel {kind} file?)")
    return data


def read_json(path: str | os.PathLike, kind: str) -> dict[str, Any]:
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
    return check_format(data, kind, str(path))


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
