"""Errors that Caramel raises for user mistakes.

`CaramelError` is a `ValueError`: bad input from a user (a file, a flag, a model that
does not match its plan) gets one of these with a message that names the input and
says what was expected. Programmer errors stay `assert`s.
"""
from __future__ import annotations

import numbers


class CaramelError(ValueError):
    """A user-facing error: the message names the bad input and what is expected."""


class FormatError(CaramelError):
    """A JSON file of ours (profile, plan, cluster spec, trace) is missing, malformed or of the wrong kind."""


class MismatchError(CaramelError):
    """Ranks, a model and a plan, or a profile and a plan disagree about something they must share."""


def check_keys(value: object, keys: tuple[str, ...], what: str) -> dict:
    """`value` as a dict whose keys are among `keys`; else one CaramelError naming `what`, the
    unknown keys and the expected ones."""
    if not isinstance(value, dict):
        raise CaramelError(f"{what} must be a dict with keys {', '.join(keys)}, got {value!r}")
    unknown = sorted(set(value) - set(keys), key=str)
    if unknown:
        raise CaramelError(f"{what}: unknown key(s) {', '.join(map(repr, unknown))}; expected {', '.join(keys)}")
    return value


def is_int(value: object) -> bool:
    """An integer (a numpy one too), not a bool: a bool is an int to Python, never meant as a
    count, a rank or a seed."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
