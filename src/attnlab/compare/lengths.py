"""Metrics at lengths, for any task that logs `<stage>/<measure>@L`: a language model's
perplexity at each evaluation length L (`attnlab.tasks.lm.data`), a synthetic task's exact match in
each bucket of lengths (`attnlab.tasks.synthetic.data`).

A run may write lengths/<stage>.json (each length's numbers, and whether its model could
take that length). A length beyond the positions the model was built for (pe=learned's
max_len) is not applicable: logged as NaN and recorded `"applicable": false`, or, without
the record, past its config's smallest max_len. Here it reads "n/a"; a NaN for another
reason (a run that diverged) stays NaN.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration, summary
from attnlab.plots import Band

AT_LENGTH = re.compile(r"(?P<measure>(?P<stage>[^/]+)/[^@]+)@(?P<length>\d+)")
NOT_APPLICABLE = "n/a"
STAGE = "test"
BOUNDED = ("pe", "synthesizer")  # the config groups whose max_len bounds the positions


def at_length(metric: str) -> tuple[str, int] | None:
    """("test/ppl", 64) for "test/ppl@64"; None for a metric not at a length."""
    match = AT_LENGTH.fullmatch(metric)
    return (match["measure"], int(match["length"])) if match else None


def order(metric: str) -> tuple[str, int]:
    """Sorts the metrics at lengths by measure, then by length (64 before 128)."""
    found = at_length(metric)
    return found if found else (metric, 0)


def record(run: Run, stage: str = STAGE) -> dict[str, Any]:
    """The run's lengths/<stage>.json; {} where it has none (or an unreadable one)."""
    try:
        found = json.loads((run.path / "lengths" / f"{stage}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return found if isinstance(found, dict) else {}


def max_lens(node: object) -> Iterator[int]:
    """Every integer `max_len` in a config subtree (a PE's, a URPE base's, a synthesizer's or
    its mixture components')."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "max_len" and isinstance(value, int) and not isinstance(value, bool):
                yield value
            else:
                yield from max_lens(value)
    elif isinstance(node, list):
        for item in node:
            yield from max_lens(item)


def config_bound(run: Run) -> int | None:
    """The most positions the run's config allows: the smallest max_len of its positional
    encoding and synthesizer (one given as an interpolation is not read); None where neither
    has one."""
    nodes = [OmegaConf.select(run.config, group, default=None) for group in BOUNDED]
    found = [
        bound
        for node in nodes
        if isinstance(node, DictConfig)
        for bound in max_lens(OmegaConf.to_container(node, resolve=False))
    ]
    return min(found, default=None)


def applicable(run: Run, metric: str) -> bool:
    """Whether the run's model can take the length `metric` is at (a metric at no length is
    applicable): as lengths/<stage>.json records, else as its config's max_len allows."""
    found = AT_LENGTH.fullmatch(metric)
    if not found:
        return True
    length, recorded = int(found["length"]), record(run, found["stage"])
    entry = recorded.get("lengths", {}).get(str(length))
    if isinstance(entry, dict):
        return entry.get("applicable", True) is not False
    bound = recorded["max_positions"] if "max_positions" in recorded else config_bound(run)
    return bound is None or length <= bound


def value(run: Run, metric: str) -> float | str | None:
    """The run's last value of `metric` as a table shows it: "n/a" at a length its model
    cannot take, NaN where it logged NaN last, None where it logged nothing."""
    if not applicable(run, metric):
        return NOT_APPLICABLE
    return math.nan if metric in run.nan else run.last(metric)


def seeds_summary(
    config: Configuration, metric: str, summarize: Callable[[list[float]], str] = summary
) -> str:
    """`metric` over the configuration's seeds (by default its mean and 95% interval), "n/a" where
    no seed's model can take its length, and how many seeds logged NaN: "5.210; 1 nan"."""
    if not any(applicable(run, metric) for run in config.runs):
        return NOT_APPLICABLE
    text = summarize(config.values(metric))
    nans = sum(metric in run.nan for run in config.runs)
    if not nans:
        return text
    return f"{text}; {nans} nan" if text else "nan"


def lengths(runs: list[Run], measure: str) -> list[int]:
    """The lengths at which some run logged `measure` ("test/ppl"), a number or NaN."""
    found = (at_length(metric) for run in runs for metric in (*run.metrics, *run.nan))
    return sorted({key[1] for key in found if key and key[0] == measure})


def by_length(run: Run, measure: str) -> dict[int, float]:
    """The run's values of `measure` ("test/ppl") at each length it has a number for (last:
    not NaN)."""
    found = (
        (at_length(metric), series[-1][1])
        for metric, series in run.metrics.items()
        if metric not in run.nan
    )
    return {key[1]: number for key, number in found if key and key[0] == measure}


def band(per_run: list[Mapping[int, float]]) -> Band | None:
    """The mean, smallest and largest value over the runs at each x every run has a finite
    value at; None where there is no such x."""
    common = set.intersection(*(set(values) for values in per_run)) if per_run else set()
    xs = sorted(x for x in common if all(math.isfinite(values[x]) for values in per_run))
    if not xs:
        return None
    columns = [[values[x] for values in per_run] for x in xs]
    means = [sum(column) / len(column) for column in columns]
    return xs, means, [min(column) for column in columns], [max(column) for column in columns]


def training_length(configs: list[Configuration]) -> dict[float, str]:
    """A mark at the training length (block_size), where every run trained on one length."""
    found = {run.setting("task.data.block_size") for config in configs for run in config.runs}
    length = found.pop() if len(found) == 1 else None
    return {float(length): f"training length ({length})"} if length else {}


def past_bound(config: Configuration, measure: str) -> str:
    """What its label adds in a plot: " (n/a past 64)" where the configuration's model has
    fewer positions than the longest evaluation length, else nothing."""
    measured = lengths(config.runs, measure)
    bad = [n for n in measured if not all(applicable(r, f"{measure}@{n}") for r in config.runs)]
    good = [n for n in measured if n not in bad]
    return f" (n/a past {max(good)})" if bad and good else " (n/a)" if bad else ""
