"""A results block's options (`<!-- results:<study> <kind> key=value ... -->`), read and
checked: each bad one is one sentence naming the block (`where`: its page and study, e.g.
"docs/results/probe/README.md block probe_table")."""

from __future__ import annotations

import dataclasses

from attnlab.compare.runs import Run
from attnlab.compare.seeds import Configuration, label_pairs
from attnlab.errors import ConfigError

OPTIONS = ("baseline", "among", "margin", "beside", "per_task")  # key=value, any order
PER_TASK = "per_task"  # what a `per_task=` key reads in the block's labels


def block_options(where: str, text: str) -> dict[str, str]:
    """A block's options ("baseline=pe=none among=a;b") by name."""
    pairs = [option.partition("=") for option in text.split()]
    if bad := [key + equals + value for key, equals, value in pairs
               if key not in OPTIONS or not value]:  # fmt: skip
        raise ConfigError(
            f"{where} has option {', '.join(bad)}: write each option as "
            f"{' or '.join(f'{name}=<value>' for name in OPTIONS)}"
        )
    return {key: value for key, _, value in pairs}


def bleu_margin(where: str, margin: str | None) -> float | None:
    """A block's `margin=` as a number of BLEU points (None without one)."""
    if margin is None:
        return None
    try:
        value = float(margin)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"{where} has margin={margin}: write a positive number of BLEU points, e.g. margin=0.4"
        )
    return value


def named(configs: list[Configuration], labels: list[str], where: str) -> list[Configuration]:
    """The configurations labelled `labels` (without the task; their keys in any order), in
    the order of `labels`."""
    pairs = [label_pairs(label) for label in labels]
    if repeated := [label for n, label in enumerate(labels) if pairs[n] in pairs[:n]]:
        raise ConfigError(
            f"{where} names {', '.join(repeated)} twice among its "
            "configurations: name each configuration once"
        )
    kept = {
        label: [config for config in configs if config.answers_to(label, "task")]
        for label in labels
    }
    if missing := [label for label, found in kept.items() if not found]:
        found = {config.label_without("task") for config in configs}
        raise ConfigError(
            f"{where} names {', '.join(missing)} among its configurations, "
            f"which its records do not hold: use labels of {'; '.join(sorted(found))}"
        )
    return [config for found in kept.values() for config in found]


def set_per_task(runs: list[Run], keys: list[str], where: str) -> tuple[list[Run], str]:
    """The block's own runs with each of `keys` read as "per_task", and a sentence giving the
    value each task set: a setting matched to each task (T5's `pe.max_distance` to its
    training distances) is one configuration across tasks, ranked as one. ConfigError where
    a task's runs disagree on it (a setting swept within a task is not set per task)."""
    told = []
    for key in keys:
        values: dict[str, set[str]] = {}
        for run in runs:
            values.setdefault(str(run.setting("task.name")), set()).add(run.value(key))
        if all(found == {""} for found in values.values()):
            raise ConfigError(
                f"{where} has per_task={key}, which none of its runs sets: "
                "name a key of their overrides or configs, e.g. per_task=pe.max_distance"
            )
        if swept := sorted(task for task, found in values.items() if len(found) > 1):
            raise ConfigError(
                f"{where} has per_task={key}, but the runs of "
                f"{', '.join(swept)} differ in it: name only keys that each task sets once"
            )
        given = ", ".join(f"{task} {found.pop() or 'unset'}" for task, found in values.items())
        told.append(f"`{key}`: {given}")
    runs = [
        dataclasses.replace(run, overrides={**run.overrides, **dict.fromkeys(keys, PER_TASK)})
        for run in runs
    ]
    return (
        runs,
        f"Set per task in this study's runs (read `{PER_TASK}` in the labels): {'; '.join(told)}.",
    )
