"""Runs that differ only in their seed, taken together as one configuration.

A configuration's value of a metric is the mean over its seeds with the half-width of its
95% Student's t interval ("5.210 ± 0.130"; with one seed "5.210 (1 seed: no interval)").
Two configurations are compared by `attnlab.compare.differences` (paired by seed, Holm over
a table), which needs at least MIN_SEEDS seeds; `equivalence` tests paired differences for
closeness within a margin.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from attnlab.compare.runs import Run

SEED = "seed"
MIN_SEEDS = 3  # seeds each configuration needs before a comparison draws a conclusion


@dataclass
class Configuration:
    setting: dict[str, str]  # the swept overrides other than the seed
    runs: list[Run]

    @property
    def label(self) -> str:
        """Its swept overrides (those it has a value of); the run's name where nothing but the
        seed was swept."""
        return self.label_without()

    def label_without(self, *keys: str) -> str:
        """Its label without the overrides of `keys` (the task, where a plot has a panel per
        task); the run's name where nothing else was swept."""
        found = self.setting.items()
        text = ",".join(f"{key}={value}" for key, value in found if value and key not in keys)
        return text or self.runs[0].name

    def answers_to(self, label: str, *without: str) -> bool:
        """Whether `label` names it (without the overrides of `without`), its `key=value`
        pairs in any order: the order of a label's keys follows the records read, so it
        changes when records are added, and a name written in RESULTS.md must not."""
        return label_pairs(self.label_without(*without)) == label_pairs(label)

    def values(self, metric: str) -> list[float]:
        return [value for run in self.runs if (value := run.last(metric)) is not None]

    def mean(self, metric: str) -> float | None:
        values = self.values(metric)
        return sum(values) / len(values) if values else None

    def curve(self, metric: str) -> tuple[list[int], list[float]]:
        """The mean of `metric` over the seeds at each step that every seed logged."""
        steps, mean, _, _ = self.band(metric)
        return steps, mean

    def band(self, metric: str) -> tuple[list[int], list[float], list[float], list[float]]:
        """At each step that every seed logged: the mean of `metric` over the seeds, and the
        smallest and largest value."""
        series = [dict(run.metrics.get(metric, [])) for run in self.runs]
        steps = sorted(set.intersection(*(set(values) for values in series)))
        at = [[values[step] for values in series] for step in steps]
        return steps, [sum(v) / len(v) for v in at], [min(v) for v in at], [max(v) for v in at]

    def by_position(self) -> dict[int, float]:
        """Mean accuracy at each position over the seeds that measured it."""
        found: dict[int, list[float]] = {}
        for run in self.runs:
            for position, value in run.by_position().items():
                found.setdefault(position, []).append(value)
        return {p: sum(values) / len(values) for p, values in sorted(found.items())}


def label_pairs(label: str) -> frozenset[str]:
    """A label's `key=value` pairs; a piece without "=" belongs to the value before it (a value
    with a comma in it)."""
    pairs: list[str] = []
    for piece in label.split(","):
        if "=" in piece or not pairs:
            pairs.append(piece)
        else:
            pairs[-1] += "," + piece
    return frozenset(pairs)


def configurations(runs: list[Run], keys: list[str]) -> list[Configuration]:
    """The runs grouped by their values of the swept `keys` but the seed, in order of the
    first run of each group."""
    grouped: dict[tuple[str, ...], Configuration] = {}
    setting_keys = [key for key in keys if key != SEED]
    for run in runs:
        setting = {key: run.value(key) for key in setting_keys}
        key = tuple(setting.values())
        grouped.setdefault(key, Configuration(setting, [])).runs.append(run)
    return list(grouped.values())


def number(value: float, digits: int = 3) -> str:
    """`digits` decimals, or `digits` significant digits for a value those decimals would
    show as zero (a distinct-1 of 0.000158 is not 0.000)."""
    if value != 0 and abs(value) < 10 ** (1 - digits):
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}"


def interval(values: list[float], confidence: float = 0.95) -> float | None:
    """The half-width of the t interval of the mean of `values` at `confidence`: the seeds
    taken as a sample of the seeds there could be. None for fewer than two values."""
    if len(values) < 2:
        return None
    from scipy.stats import t as student_t  # most of a second to import: only when needed

    quantile = float(student_t.ppf((1 + confidence) / 2, len(values) - 1))
    return quantile * statistics.stdev(values) / math.sqrt(len(values))


def summary(values: list[float], digits: int = 3, unit: str = "seed") -> str:
    """The mean and the half-width of its 95% t interval over seeds (or other `unit`s):
    "5.210 ± 0.130"; with one value "5.210 (1 seed: no interval)"."""
    if not values:
        return ""
    mean, half = number(sum(values) / len(values), digits), interval(values)
    return f"{mean} (1 {unit}: no interval)" if half is None else f"{mean} ± {number(half, digits)}"


def best_first(configs: list[Configuration], metric: str, mode: str) -> list[Configuration]:
    """The configurations by their mean of `metric`, best first; those without it last."""

    def key(config: Configuration) -> tuple[bool, float]:
        mean = config.mean(metric)
        return (mean is None, -(mean or 0.0) if mode == "max" else (mean or 0.0))

    return sorted(configs, key=key)


def equivalence(differences: list[float], margin: float, unit: str = "seeds") -> str:
    """Two one-sided tests (Schuirmann 1987), each at 5%, on paired differences: "equivalent"
    when the 90% t interval of their mean lies inside ±margin, "not equivalent" when it lies
    wholly outside, "inconclusive" when it crosses a bound; with the interval. "fewer than
    MIN_SEEDS seeds" for fewer differences."""
    if len(differences) < MIN_SEEDS:
        return f"fewer than {MIN_SEEDS} {unit}"
    mean, half = statistics.mean(differences), interval(differences, 0.90)
    assert half is not None
    low, high = mean - half, mean + half
    found = (
        "equivalent"
        if -margin < low and high < margin
        else "not equivalent"
        if low >= margin or high <= -margin
        else "inconclusive"
    )
    return f"{found} (90% interval {low:+.2f} to {high:+.2f})"
