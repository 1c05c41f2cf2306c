"""Checks of single setting values: counts, numbers, and the scalar types options declare."""

from __future__ import annotations

from typing import Any

from attnlab.errors import ConfigError


def is_count(value: Any, least: int = 1) -> bool:
    """An integer (not a bool) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def require_counts(prefix: str, least: int = 1, **values: Any) -> None:
    """ConfigError for the first value that is not an integer of at least `least`."""
    for name, value in values.items():
        if not is_count(value, least):
            kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
            raise ConfigError(f"{prefix}.{name}={value!r} must be {kind}")


SCALARS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def scalar_annotation(annotation: Any) -> list[str] | None:
    """The names of `int | float | bool | str | None`-style annotations; None for any other."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    names = [name.strip() for name in text.split("|")]
    return names if all(name in SCALARS or name == "None" for name in names) else None


def fits(names: list[str], value: Any) -> bool:
    """Whether `value` is of one of the scalar types `names` (an int is a float, a bool is
    neither)."""
    kinds = {
        "None": value is None,
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": is_number(value),
        "str": isinstance(value, str),
    }
    return any(kinds[name] for name in names)
