"""The synthetic tasks' tables in RESULTS.md (kind `generalization`): test exact match in each
bucket of lengths per task with its 95% t interval over the seeds, how many seeds learned the
task, each configuration's mean reciprocal rank across tasks and seeds (Kazemnejad et al.
2023, Fig. 1), and, for a block's `among=` configurations, the verdict rule's answer for each
pair of them."""

from __future__ import annotations

from attnlab.compare.lengths import (
    ACCURACY,
    by_task,
    lengths,
    longer_accuracies,
    reciprocal_ranks,
)
from attnlab.compare.report import Row, markdown_table
from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration, compared, summary


def learned(run: Run) -> bool | None:
    """Whether the run's validation exact match reached its early-stopping threshold within
    its budget (None for a run without one)."""
    threshold = run.setting("callbacks.early_stopping.stopping_threshold")
    best = run.best("val/acc", "max")
    return None if threshold in (None, "None") or best is None else best >= float(threshold)


def generalization_table(configs: list[Configuration]) -> str:
    """Per task and configuration: how many seeds learned the task (validation exact match
    at the early-stopping threshold), test exact match in each bucket (the first holds the
    training lengths), the mean ± the half-width of its 95% t interval over the seeds; then
    each configuration's mean reciprocal rank over the tasks and seeds."""
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
    return "\n\n".join([*parts, ranks_table(reciprocal_ranks(grouped))])


def ranks_table(ranks: dict[str, list[float]]) -> str:
    rows = [
        {"configuration": label, "ranked": len(found), "mean reciprocal rank": summary(found)}
        for label, found in sorted(ranks.items(), key=lambda item: -sum(item[1]) / len(item[1]))
    ]
    legend = (
        "**Mean reciprocal rank** over every task and seed: configurations ranked by exact "
        "match in the buckets past the training lengths (their mean), ties sharing a rank"
    )
    return f"{legend}\n\n{markdown_table(rows)}"


def generalization_contrasts(configs: list[Configuration]) -> str:
    """The configurations' mean reciprocal ranks among themselves; then each pair, the first
    listed against the second, by the verdict rule: on the mean reciprocal rank (its values
    one per task and seed) and, per task, on exact match past the training lengths (its
    values one per seed)."""
    grouped = by_task(configs)
    ranks = reciprocal_ranks(grouped)
    labels = list(dict.fromkeys(label for found in grouped.values() for label in found))
    rows = []
    for index, first in enumerate(labels):
        for second in labels[index + 1 :]:
            cells: Row = {"first": first, "second": second}
            cells["mean reciprocal rank"] = compared(ranks.get(first, []), ranks.get(second, []))
            for task, found in grouped.items():
                if first in found and second in found:
                    cells[task] = compared(
                        longer_accuracies(found[first]), longer_accuracies(found[second])
                    )
            rows.append(cells)
    legend = (
        "**Pairs**, by the verdict rule: the first against the second (ahead, behind or tie) "
        "on the mean reciprocal rank and, per task, on exact match past the training lengths"
    )
    return f"{ranks_table(ranks)}\n\n{legend}\n\n{markdown_table(rows)}"
