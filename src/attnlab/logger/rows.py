"""What a row of a run's metrics.csv says about when it was logged: its step, a count of
optimizer steps. Read by the resume (which drops rows after its checkpoint) and by compare,
so both refuse the same edited files; imports nothing heavy."""

from __future__ import annotations

import math


def logged_step(text: str) -> int | None:
    """The step a metrics row records (Lightning writes an int, a float once a column mixes
    types: `3` or `3.0`), or None where the text is no whole count of steps (`inf`, `nan`,
    `-1`, `2.5`, words)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value) or value < 0 or not value.is_integer():
        return None
    return int(value)
