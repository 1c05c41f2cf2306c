"""The synthetic tasks' ranks (Kazemnejad et al. 2023, Fig. 1): each configuration's
reciprocal rank per task and seed, and two ways to average them.

The task as the unit (`ranks_table`): in one task and seed every configuration is ranked
against the others, so its ranks are coupled across configurations and are not independent
samples. Each configuration's reciprocal rank in a task is the mean over the task's seeds;
its mean reciprocal rank is the mean over tasks with a t interval over tasks. A task that no
run of any configuration learned ranks failures: it is left out, and named.

The paper's way (`paper_table`): reciprocal ranks pooled over every task × seed column,
each run ranked by its overall test exact match (`test/acc`), printed beside the paper's
published values (PUBLISHED). Their code ranks five encodings and breaks ties by their
order; here ties share their mean rank, and the ranks are among the table's configurations.
"""

from __future__ import annotations

import statistics

from attnlab.compare.lengths import STAGE, by_length, lengths
from attnlab.compare.runs import Run, is_number_text
from attnlab.compare.seeds import Configuration, label_pairs, number, summary
from attnlab.compare.table import Row, markdown_table
from attnlab.errors import ConfigError

ACCURACY = f"{STAGE}/acc"
# Kazemnejad et al. 2023, Fig. 1: mean reciprocal rank over their tasks and seeds
PUBLISHED = {
    "pe=none": 0.69,
    "pe=t5": 0.55,
    "pe=alibi": 0.50,
    "pe=rope": 0.33,
    "pe=sinusoidal": 0.22,
}


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
                ranks.setdefault(label, {}).setdefault(task, []).append(reciprocal(score, scores))
    return ranks


def reciprocal(score: float, scores: dict[str, float]) -> float:
    """1/rank of `score` among `scores`, best (highest) first, tied values sharing their mean
    rank."""
    better = sum(other > score for other in scores.values())
    tied = sum(other == score for other in scores.values())
    return 1 / (better + (tied + 1) / 2)


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


def overall_ranks(grouped: dict[str, dict[str, Configuration]]) -> dict[str, list[float]]:
    """label -> 1/rank in each task × seed column that every configuration ran, ranked by
    the run's overall test exact match (`test/acc`), ties sharing their mean rank."""
    labels = {label for found in grouped.values() for label in found}
    ranks: dict[str, list[float]] = {}
    for found in grouped.values():
        by_seed: dict[str, dict[str, float]] = {}
        for label, config in found.items():
            for run in config.runs:
                if (score := run.last(ACCURACY)) is not None:
                    by_seed.setdefault(run.value("seed"), {})[label] = score
        for scores in by_seed.values():
            if set(scores) == labels:
                for label, score in scores.items():
                    ranks.setdefault(label, []).append(reciprocal(score, scores))
    return ranks


def published(label: str) -> float | None:
    """The paper's mean reciprocal rank of the encoding `label` names alone, if it has one."""
    return next(
        (v for name, v in PUBLISHED.items() if label_pairs(name) == label_pairs(label)), None
    )


def paper_table(grouped: dict[str, dict[str, Configuration]]) -> str:
    """The mean reciprocal rank the paper's way (the module docstring), beside its values."""
    ranks = overall_ranks(grouped)
    if len(ranks) < 2:
        return ""
    columns = len(next(iter(ranks.values())))
    rows: list[Row] = []
    for label, found in sorted(ranks.items(), key=lambda item: -statistics.fmean(item[1])):
        cells: Row = {"configuration": label, "columns": len(found)}
        cells["mean 1/rank, pooled"] = number(statistics.fmean(found))
        if any(published(name) is not None for name in ranks):
            paper = published(label)
            cells["Kazemnejad et al. 2023, Fig. 1"] = "" if paper is None else f"{paper:.2f}"
        rows.append(cells)
    legend = (
        "**Mean reciprocal rank, the paper's way** (Kazemnejad et al. 2023, Fig. 1): in each "
        f"of the {columns} task × seed columns that every configuration ran, configurations "
        "ranked by overall test exact match (`test/acc`), ties sharing their mean rank; the "
        "mean of 1/rank over the columns, pooled, with no interval (the columns of one task "
        f"share its configurations). Ranked among these {len(ranks)} configurations; the "
        "paper's code ranks its five encodings and breaks ties by their order."
    )
    return f"{legend}\n\n{markdown_table(rows)}"
