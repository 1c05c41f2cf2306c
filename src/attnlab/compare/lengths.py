"""Metrics by length: language-model runs (task=lm) by evaluation length, with their loss by
position, and the synthetic tasks' exact match by bucket of test lengths (end of file).

An evaluation of a language model logs `<stage>/<measure>@L` for each evaluation length L
(loss, ppl, ppl_sliding; bpc and bpc_sliding with the char tokenizer) and writes, into the run
directory, lengths/<stage>.json (each length's numbers) and lengths/<stage>_loss_by_position.csv
(the mean loss at each position of the non-overlapping windows of each length); see
`attnlab.systems.lm`. A length beyond the positions the model was built for (pe=learned's
max_len) is not applicable: logged as NaN and recorded `"applicable": false`. Here it reads
"n/a"; a NaN for another reason (a run that diverged) stays NaN.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration, summary
from attnlab.data.task import WINDOWS
from attnlab.plots import Band, bands_figure, heatmap_figure, save

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


def sinks_by_layer(run: Run, stage: str = STAGE) -> dict[int, list[float]]:
    """length -> the attention sink of each layer there (`sink_by_layer`), as the run's
    lengths/<stage>.json records it; {} where it measured none (no task.system.sink_windows)."""
    found = record(run, stage).get("lengths")
    entries = found.items() if isinstance(found, dict) else []
    return {
        int(length): [float(share) for share in entry["sink_by_layer"]]
        for length, entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("sink_by_layer"), list)
    }


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


def loss_by_position(run: Run, stage: str = STAGE) -> dict[int, dict[int, float]]:
    """length -> position -> mean loss there, from lengths/<stage>_loss_by_position.csv (only
    the lengths the model could take are in it); {} where the run has no such file."""
    curves: dict[int, dict[int, float]] = {}
    try:
        with (run.path / "lengths" / f"{stage}_loss_by_position.csv").open(newline="") as file:
            for row in csv.DictReader(file):
                curves.setdefault(int(row["length"]), {})[int(row["position"])] = float(row["loss"])
    except FileNotFoundError:
        return {}
    return curves


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


def ppl_bands(configs: list[Configuration], measure: str) -> dict[str, Band]:
    """Per configuration label: its `measure` by evaluation length, mean and range over seeds."""
    found = {
        config.label + past_bound(config, measure): band(
            [by_length(run, measure) for run in config.runs]
        )
        for config in configs
    }
    return {label: values for label, values in found.items() if values}


def plot_ppl_by_length(configs: list[Configuration], path: Path) -> list[Path]:
    """Perplexity by evaluation length, non-overlapping and sliding windows side by side: one
    line per configuration, the mean over its seeds, the range shaded."""
    panels = {
        f"{windows.name} windows": ppl_bands(configs, f"{STAGE}/{windows.perplexity}")
        for windows in WINDOWS
    }
    panels = {title: bands for title, bands in panels.items() if bands}
    if not panels:
        return []
    figure = bands_figure(
        panels, "evaluation length (tokens)", f"{STAGE} perplexity", training_length(configs)
    )
    return [save(figure, path)]


def position_bands(configs: list[Configuration]) -> dict[str, Band]:
    """Per configuration: its loss by position in the windows of the longest length every
    seed's model could take, mean and range over the seeds; labelled with that length."""
    bands: dict[str, Band] = {}
    for config in configs:
        curves = [loss_by_position(run) for run in config.runs]
        common = set.intersection(*(set(curve) for curve in curves))
        found = band([curve[max(common)] for curve in curves]) if common else None
        if found:
            bands[f"{config.label} (L = {max(common)})"] = found
    return bands


def plot_loss_by_position(configs: list[Configuration], path: Path) -> list[Path]:
    """Each configuration's test loss at each position of its longest windows
    (`position_bands`): the mean over its seeds, the range shaded."""
    bands = position_bands(configs)
    if not bands:
        return []
    panels = {"loss at each position of the non-overlapping windows": bands}
    figure = bands_figure(
        panels, "position in the window", f"{STAGE} loss (nats per token)",
        training_length(configs), log_y=False,
    )  # fmt: skip
    return [save(figure, path)]


# the synthetic tasks (attnlab.systems.synthetic): exact match by bucket of lengths

ACCURACY = f"{STAGE}/acc"


def by_task(configs: list[Configuration]) -> dict[str, dict[str, Configuration]]:
    """task -> the configuration's label without the task -> configuration, for the
    configurations that logged exact match by length."""
    grouped: dict[str, dict[str, Configuration]] = {}
    for config in configs:
        if not lengths(config.runs, ACCURACY):
            continue
        task = str(config.runs[0].setting("task.name"))
        grouped.setdefault(task, {})[config.label_without("task")] = config
    return grouped


def plot_accuracy_by_length(configs: list[Configuration], path: Path) -> list[Path]:
    """Test exact match by bucket of lengths (named by its longest), a panel per task: one
    line per configuration, the mean over its seeds, the range shaded."""
    panels = {
        task: {
            label: found
            for label, config in found_configs.items()
            if (found := band([by_length(run, ACCURACY) for run in config.runs]))
        }
        for task, found_configs in by_task(configs).items()
    }
    panels = {task: bands for task, bands in panels.items() if bands}
    if not panels:
        return []
    figure = bands_figure(
        panels, "test length (the longest of each bucket)", "test exact match", {}, log_y=False
    )
    return [save(figure, path)]


def longest_bucket_matrix(
    configs: list[Configuration],
) -> tuple[list[list[float]], list[str], list[str]]:
    """Mean test exact match over seeds in each task's longest bucket: [tasks, labels] (NaN
    where a configuration did not run a task or that bucket), with the task and label names."""
    grouped = by_task(configs)
    labels = list(dict.fromkeys(label for found in grouped.values() for label in found))
    matrix = []
    for found in grouped.values():
        longest = max(lengths([run for c in found.values() for run in c.runs], ACCURACY))
        values = [found[label].values(f"{ACCURACY}@{longest}") if label in found else []
                  for label in labels]  # fmt: skip
        matrix.append([sum(v) / len(v) if v else math.nan for v in values])
    return matrix, list(grouped), labels


def plot_longest_bucket(configs: list[Configuration], path: Path) -> list[Path]:
    """A heat map of tasks x configurations: exact match in each task's longest bucket."""
    matrix, tasks, labels = longest_bucket_matrix(configs)
    if not tasks:
        return []
    title = "test exact match in each task's longest bucket (mean over seeds)"
    figure = heatmap_figure(np.array(matrix), tasks, labels, title, ("configuration", "task"))
    return [save(figure, path)]


def longer_accuracy(run: Run) -> float | None:
    """A run's mean test exact match over its buckets past the first (the training lengths):
    how well it generalizes to longer inputs; None without such buckets."""
    found = by_length(run, ACCURACY)
    longer = [found[end] for end in sorted(found)[1:]]
    return sum(longer) / len(longer) if longer else None


def longer_accuracies(config: Configuration) -> list[float]:
    """`longer_accuracy` of each of the configuration's seeds that has one."""
    return [found for run in config.runs if (found := longer_accuracy(run)) is not None]


def reciprocal_ranks(
    grouped: dict[str, dict[str, Configuration]],
) -> dict[str, dict[str, list[float]]]:
    """label -> task -> 1/rank of its configuration in each seed of the task that both ran,
    ranked by `longer_accuracy`, best first, tied values sharing their mean rank (Kazemnejad
    et al. 2023, Fig. 1, rank exact match per task and seed and average 1/rank)."""
    ranks: dict[str, dict[str, list[float]]] = {}
    for task, found in grouped.items():
        by_seed: dict[str, dict[str, float]] = {}
        for label, config in found.items():
            for run in config.runs:
                score = longer_accuracy(run)
                if score is not None:
                    by_seed.setdefault(str(run.setting("seed")), {})[label] = score
        for scores in by_seed.values():
            for label, score in scores.items():
                better = sum(other > score for other in scores.values())
                tied = sum(other == score for other in scores.values())
                ranks.setdefault(label, {}).setdefault(task, []).append(
                    1 / (better + (tied + 1) / 2)
                )
    return ranks
