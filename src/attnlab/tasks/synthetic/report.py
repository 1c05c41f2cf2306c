"""The synthetic tasks' tables in RESULTS.md (kind `generalization`): test exact match in each
bucket of lengths per task with its 95% t interval over the seeds, how many seeds learned the
task, each configuration's mean reciprocal rank across tasks (`attnlab.tasks.synthetic.ranks`:
the task as the unit, and the paper's way), each configuration's difference from a baseline in
exact match past the training lengths, and, for a block's `among=` configurations, each pair
of them compared.

Differences come from `attnlab.compare.differences`: within a task paired by seed (Welch's t
where the seeds differ), over tasks paired by task (the mean of the per-task mean
differences, a t interval over tasks), Holm–Bonferroni over each table's comparisons. Exact
match at or below the task's chance level (its `task.chance` where it declares one, else
0.0) in every run of both is degenerate: no verdict, and such a task is left out of the
aggregate over tasks.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from attnlab.compare.differences import (
    PAIRED_BY_TASK,
    Chance,
    Difference,
    baseline_of,
    corrected,
    difference,
    family_legend,
    formatted,
)
from attnlab.compare.kinds import ComparisonPlot, Kind
from attnlab.compare.lengths import band, by_length, lengths
from attnlab.compare.seeds import Configuration, number, summary
from attnlab.compare.table import Row, markdown_table
from attnlab.plots import bands_figure, heatmap_figure, save
from attnlab.tasks.synthetic.ranks import (
    ACCURACY,
    by_task,
    learned,
    left_out,
    longer_accuracies,
    longer_accuracy,
    paper_table,
    ranks_table,
    task_ranks,
)

ALL_TASKS = "all tasks"


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


def generalization_table(configs: list[Configuration], baseline: str | None = None) -> str:
    """Per task and configuration: how many seeds learned the task (`learned`), test exact
    match in each bucket (the first holds the training lengths), the mean ± the half-width
    of its 95% t interval over the seeds; then each configuration's mean reciprocal rank
    over the tasks, the paper's way, and its difference from `baseline` (a label without the
    task; None: the first configuration)."""
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
    parts += [ranks_table(grouped, left, task_ranks(grouped, left)), paper_table(grouped)]
    parts.append(baseline_table(grouped, baseline))
    return "\n\n".join(part for part in parts if part)


def by_seed_longer(config: Configuration) -> dict[str, float]:
    """Each seed's mean exact match past the training lengths (`longer_accuracy`)."""
    found = {run.value("seed"): longer_accuracy(run) for run in config.runs}
    return {seed: value for seed, value in found.items() if value is not None}


def chance(config: Configuration) -> Chance:
    """The task's chance level of exact match: its `task.chance`, else 0.0."""
    declared = config.runs[0].setting("task.chance")
    level = float(declared) if declared not in (None, "None") else 0.0
    return Chance(level, f"exact match {number(level)}")


def in_task(first: Configuration, second: Configuration) -> Difference:
    """Exact match past the training lengths, first − second, paired by seed."""
    return difference(by_seed_longer(first), by_seed_longer(second), chance=chance(first))


def over_tasks(
    grouped: dict[str, dict[str, Configuration]],
    first: str,
    second: str,
    found: dict[str, Difference],
) -> Difference:
    """first − second over the tasks both ran and not every run of both at chance (`found`,
    per task): the per-task means paired by task."""
    kept = [task for task, d in found.items() if not d.note.startswith("every run at chance")]
    means = [
        {task: statistics.fmean(by_seed_longer(grouped[task][label]).values()) for task in kept}
        for label in (first, second)
    ]
    return difference(*means, unit="task")


def pair_cells(
    grouped: dict[str, dict[str, Configuration]], first: str, second: str
) -> dict[str, Difference]:
    """first − second over tasks (ALL_TASKS), then in each task both ran."""
    found = {
        task: in_task(configs[first], configs[second])
        for task, configs in grouped.items()
        if first in configs and second in configs and by_seed_longer(configs[first])
        and by_seed_longer(configs[second])
    }  # fmt: skip
    return {ALL_TASKS: over_tasks(grouped, first, second, found), **found}


def corrected_cells(table: list[dict[str, Difference]]) -> list[dict[str, Difference]]:
    """Each row's differences, Holm–Bonferroni over every one of the table's."""
    flat = corrected([d for cells in table for d in cells.values()])
    out, start = [], 0
    for cells in table:
        out.append(dict(zip(cells, flat[start : start + len(cells)], strict=True)))
        start += len(cells)
    return out


def baseline_table(grouped: dict[str, dict[str, Configuration]], baseline: str | None) -> str:
    """Each configuration's difference from the baseline in exact match past the training
    lengths: over tasks and per task, Holm over the table."""
    labels = list(dict.fromkeys(label for found in grouped.values() for label in found))
    if len(labels) < 2:
        return ""
    base = baseline_of(labels, baseline, "the baseline")
    others = [label for label in labels if label != base]
    table = corrected_cells([pair_cells(grouped, label, base) for label in others])
    rows = [
        {"configuration": label, **{k: formatted(d, "max") for k, d in cells.items()}}
        for label, cells in zip(others, table, strict=True)
    ]
    chosen = "named by the block" if baseline else "the first configuration"
    legend = (
        f"**Against {base}** ({chosen}), a standing that does not depend on who else is "
        f"ranked: exact match past the training lengths, each configuration minus {base}; "
        + differences_legend(table)
    )
    return f"{legend}\n\n{markdown_table(rows)}"


def differences_legend(table: list[dict[str, Difference]]) -> str:
    """How the cells of a table of differences were made, and its family."""
    return (
        f"{ALL_TASKS}: the mean of the per-task mean differences, {PAIRED_BY_TASK} (a t "
        "interval over the n tasks, those where some run beat chance); per task: paired by "
        "seed (Welch's t where the seeds differ). Ahead or behind where Holm's adjusted p < "
        "0.05, else tie. " + family_legend([d for cells in table for d in cells.values()])
    )


def generalization_contrasts(configs: list[Configuration], baseline: str | None = None) -> str:
    """The configurations' mean reciprocal ranks among themselves, the paper's way too;
    then each pair, the first listed against the second: on the reciprocal rank paired by
    task and on exact match past the training lengths, over tasks (paired by task) and per
    task (paired by seed), Holm over the block's pairs. `baseline` is not read: every pair is
    compared."""
    grouped = by_task(configs)
    left = left_out(grouped)
    ranks = task_ranks(grouped, left)
    labels = list(dict.fromkeys(label for found in grouped.values() for label in found))
    pairs = [(a, b) for n, a in enumerate(labels) for b in labels[n + 1 :]]
    table = corrected_cells([
        {"mean reciprocal rank": difference(ranks.get(a, {}), ranks.get(b, {}), unit="task"),
         **pair_cells(grouped, a, b)}
        for a, b in pairs
    ])  # fmt: skip
    rows = [
        {"first": a, "second": b, **{k: formatted(d, "max") for k, d in cells.items()}}
        for (a, b), cells in zip(pairs, table, strict=True)
    ]
    legend = (
        "**Pairs**: the first minus the second. The mean reciprocal rank: the per-task "
        f"reciprocal ranks {PAIRED_BY_TASK}; exact match past the training lengths, "
        + differences_legend(table)
    )
    parts = [ranks_table(grouped, left, ranks), paper_table(grouped)]
    return "\n\n".join([*filter(None, parts), f"{legend}\n\n{markdown_table(rows)}"])


KINDS = {
    "generalization": Kind(
        generalization_table,
        plot_accuracy_by_length,
        "exact match by length",
        contrasts=generalization_contrasts,
        baseline=True,
    ),
}
FIGURES = (
    ComparisonPlot("acc_by_length.png", plot_accuracy_by_length),
    ComparisonPlot("acc_longest_bucket.png", plot_longest_bucket),
)
