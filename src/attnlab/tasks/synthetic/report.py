"""The synthetic tasks' tables in RESULTS.md (kind `generalization`): test exact match in each
bucket of lengths per task with its 95% t interval over the seeds, how many seeds learned the
task, each configuration's mean reciprocal rank across tasks (Kazemnejad et al. 2023, Fig. 1),
and, for a block's `among=` configurations, the verdict rule's answer for each pair of them.

Ranks take the task as their unit: in one task and seed every configuration is ranked
against the others, so its ranks are coupled across configurations and are not independent
samples. Each configuration's reciprocal rank in a task is the mean over the task's seeds;
its mean reciprocal rank is the mean over tasks with a t interval over tasks, and two
configurations are compared paired by task (the 95% t interval of their differences). A
task that no run of any configuration learned ranks failures: it is left out, and named."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.compare.lengths import STAGE, band, by_length, lengths
from attnlab.compare.runs import Run, is_number_text
from attnlab.compare.seeds import Configuration, compared, paired_compared, summary
from attnlab.compare.table import Row, markdown_table
from attnlab.errors import ConfigError
from attnlab.plots import bands_figure, heatmap_figure, save

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
    figure = heatmap_figure(
        np.array(matrix), tasks, labels, title, ("configuration", "task"), "test exact match"
    )
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


def learned(run: Run) -> bool | None:
    """Whether the run's validation exact match reached the task's `learned_at` within its
    budget (older records, which lack it, read their early-stopping threshold; None for a
    run with neither)."""
    threshold = run.setting("task.learned_at") or run.setting(
        "callbacks.early_stopping.stopping_threshold"
    )
    best = run.best("val/acc", "max")
    if threshold in (None, "None") or best is None:
        return None
    if not is_number_text(threshold):
        raise ConfigError(
            f"{run.path}: task.learned_at={threshold!r} is not a number: write the validation "
            "exact match from which a run has learned its task, e.g. 0.99"
        )
    return best >= float(threshold)


def generalization_table(configs: list[Configuration]) -> str:
    """Per task and configuration: how many seeds learned the task (`learned`), test exact
    match in each bucket (the first holds the training lengths), the mean ± the half-width
    of its 95% t interval over the seeds; then each configuration's mean reciprocal rank
    over the tasks."""
    grouped = by_task(configs)
    parts = []
    for task, found in grouped.items():
        runs = [run for config in found.values() for run in config.runs]
        rows = []
        for label, config in found.items():
            cells: Row = {"configuration": label, "seeds": len(config.runs)}
            reached = [done for run in config.runs if (done := learned(run)) is not None]
            if reached:
                cells["learned"] = f"{sum(reached)} of {len(reached)}"
            for end in lengths(runs, ACCURACY):
                cells[f"≤{end}"] = summary(config.values(f"{ACCURACY}@{end}"))
            cells["past training"] = summary(longer_accuracies(config))
            rows.append(cells)
        parts.append(f"**{task}**: test exact match by bucket of lengths\n\n{markdown_table(rows)}")
    left = left_out(grouped)
    return "\n\n".join([*parts, ranks_table(grouped, left, task_ranks(grouped, left))])


UNLEARNED = "which no run of any configuration learned (its ranks would order failures)"
PARTIAL = "which not every configuration ran (ranks compare configurations on the same tasks)"


def left_out(grouped: dict[str, dict[str, Configuration]]) -> dict[str, list[str]]:
    """The tasks kept out of the ranks, by why: those that not every configuration ran (a
    configuration alone in a task would rank first there; Kazemnejad et al.'s code drops
    such columns too) and those that no run learned (`unlearned`)."""
    labels = {label for found in grouped.values() for label in found}
    partial = [task for task, found in grouped.items() if set(found) != labels]
    return {
        UNLEARNED: [task for task in unlearned(grouped) if task not in partial],
        PARTIAL: partial,
    }


def unlearned(grouped: dict[str, dict[str, Configuration]]) -> list[str]:
    """The tasks that no run of any configuration learned (each run has a threshold and
    never reached it)."""
    left = []
    for task, found in grouped.items():
        reached = [learned(run) for config in found.values() for run in config.runs]
        if reached and all(done is False for done in reached):
            left.append(task)
    return left


def task_ranks(
    grouped: dict[str, dict[str, Configuration]], left: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    """label -> task -> its reciprocal rank in the task, the mean over the task's seeds;
    the tasks but those `left` out (`left_out`)."""
    out = {task for tasks in left.values() for task in tasks}
    ranked = reciprocal_ranks({task: found for task, found in grouped.items() if task not in out})
    return {
        label: {task: sum(seeds) / len(seeds) for task, seeds in tasks.items()}
        for label, tasks in ranked.items()
    }


def ranks_table(
    grouped: dict[str, dict[str, Configuration]],
    left: dict[str, list[str]],
    ranks: dict[str, dict[str, float]],
) -> str:
    """The mean reciprocal ranks `ranks` (`task_ranks` of `grouped` without `left`)."""
    why = [f"{', '.join(tasks)}, {reason}" for reason, tasks in left.items() if tasks]
    note = f" Left out: {'; '.join(why)}." if why else ""
    if len(grouped) - sum(map(len, left.values())) < 2:
        return f"**Mean reciprocal rank**: not given, with fewer than two tasks to rank.{note}"
    if len(ranks) < 2:  # a lone configuration ranks first everywhere: 1.000, which says nothing
        return f"**Mean reciprocal rank**: not given, with one configuration to rank.{note}"
    by_mean = sorted(ranks.items(), key=lambda item: -sum(item[1].values()) / len(item[1]))
    rows = [
        {
            "configuration": c,
            "tasks": len(found),
            "mean reciprocal rank": summary([*found.values()], unit="task"),
        }
        for c, found in by_mean
    ]
    legend = (
        "**Mean reciprocal rank**, the task as its unit: in each task and seed, configurations "
        "ranked by exact match in the buckets past the training lengths (their mean), ties "
        "sharing a rank; a task's reciprocal rank is the mean over its seeds, the interval is "
        f"over tasks.{note}"
    )
    return f"{legend}\n\n{markdown_table(rows)}"


def paired_by_task(first: dict[str, float], second: dict[str, float]) -> str:
    """`first` against `second` on their reciprocal ranks in the tasks both have, paired by
    task (`paired_compared`)."""
    return paired_compared([first[task] - second[task] for task in first if task in second])


def generalization_contrasts(configs: list[Configuration]) -> str:
    """The configurations' mean reciprocal ranks among themselves; then each pair, the first
    listed against the second: on the mean reciprocal rank paired by task and, per task, on
    exact match past the training lengths by the verdict rule (its values one per seed)."""
    grouped = by_task(configs)
    left = left_out(grouped)
    ranks = task_ranks(grouped, left)
    labels = list(dict.fromkeys(label for found in grouped.values() for label in found))
    rows = []
    for index, first in enumerate(labels):
        for second in labels[index + 1 :]:
            cells: Row = {"first": first, "second": second}
            cells["mean reciprocal rank"] = paired_by_task(
                ranks.get(first, {}), ranks.get(second, {})
            )
            for task, found in grouped.items():
                if first in found and second in found:
                    cells[task] = compared(
                        longer_accuracies(found[first]), longer_accuracies(found[second])
                    )
            rows.append(cells)
    legend = (
        "**Pairs**: the first against the second (ahead, behind or tie) on the mean "
        "reciprocal rank, paired by task (the 95% t interval of the per-task differences), "
        "and, per task, on exact match past the training lengths by the verdict rule"
    )
    return f"{ranks_table(grouped, left, ranks)}\n\n{legend}\n\n{markdown_table(rows)}"
