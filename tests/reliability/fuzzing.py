"""Hypothesis strategies for the parser fuzz tests: random JSON values, and valid documents
with one field replaced, deleted or the text cut short."""
from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=12)


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside `doc` (dict keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw, doc: dict) -> Any:
    """`doc` with one value replaced by a random JSON value, or deleted, or the whole thing replaced."""
    doc = copy.deepcopy(doc)
    where = paths(doc)
    action = draw(st.sampled_from(["replace", "replace", "delete", "whole"]))
    if action == "whole" or not where:
        return draw(json_values)
    path = draw(st.sampled_from(where))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return doc


@st.composite
def damaged_text(draw, doc: dict) -> bytes:
    """The JSON text of `doc`, cut short, with a byte flipped, or random bytes."""
    text = json.dumps(doc, indent=1).encode()
    action = draw(st.sampled_from(["truncate", "flip", "random"]))
    if action == "truncate":
        return text[: draw(st.integers(0, len(text) - 1))]
    if action == "flip":
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + bytes([text[i] ^ draw(st.integers(1, 255))]) + text[i + 1:]
    return draw(st.binary(max_size=200))
