"""Checks of single setting values: counts, numbers, and the scalar types options declare."""

from __future__ import annotations

import math
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


INT64_MAX = 2**63 - 1  # torch's and numpy's integers, and Python's sys.maxsize on 64 bits
SEED_MAX = 2**32 - 1  # numpy's seeds (Lightning's seed_everything seeds numpy too)


def out_of_range(value: Any, key: str) -> str | None:
    """The sentence for the first setting in `value` (a config as plain data, at `key`) that
    no setting's type can hold: an integer beyond 64 bits, a number that is not finite; None
    if every one fits."""
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for name, item in items:
            where = f"{key}[{name}]" if isinstance(value, list) else f"{key}.{name}"
            found = out_of_range(item, where.removeprefix("."))
            if found:
                return found
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return (
            f"{key}={value} is beyond the range of a 64-bit integer (±{INT64_MAX:,}): "
            "give a value within it"
        )
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={value} is not a finite number (YAML reads 1e400 as inf): give one"
    return None


def check_ranges(config: dict[str, Any]) -> None:
    """ConfigError for a setting of `config` (composed, as plain data) that no type holds, or a
    seed numpy cannot take: before anything is built, so never a library's traceback."""
    found = out_of_range(config, "")
    if found:
        raise ConfigError(found)
    seed = config.get("seed")
    if seed is not None and not (is_count(seed, 0) and seed <= SEED_MAX):
        raise ConfigError(
            f"seed={seed!r} must be an integer from 0 to {SEED_MAX:,} (numpy's seeds)"
        )
