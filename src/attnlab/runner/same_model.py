"""The model a checkpoint holds against the one a command line composes: which settings may
differ (eval.py and `attnlab generate` may set a PE's `evaluation_options` on a trained model,
such as a RoPE's context extension), and the one sentence where others do."""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Collection
from typing import Any

from attnlab.config.build import declared, flatten
from attnlab.config.groups import ARCHITECTURE, DESCRIPTIVE, NOT_WEIGHTS
from attnlab.runner.resume import model_differs


def evaluation_options(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of `config`'s pe (and of a PE inside it, such as URPE's base) that
    its class lets eval.py change (`evaluation_options`), flattened: {"pe.scaling": "yarn", ...}."""
    flat = flatten({"pe": config.get("pe") or {}})
    nodes = {key.removesuffix("_target_"): evaluation_names(target) for key, target in
             flat.items() if key.endswith("._target_")}  # fmt: skip
    return {
        node + name: flat[node + name]
        for node, names in nodes.items()
        for name in names
        if node + name in flat
    }


def evaluation_names(target: Any) -> tuple[str, ...]:
    """The `evaluation_options` the PE class `target` names declares (p-RoPE inherits
    RoPE's); none for a class that is not attnlab's."""
    return declared(target, "evaluation_options", ())


def with_settings(node: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of `node` with the flattened `settings` ({"pe.scaling": "yarn"}) set in it."""
    node = copy.deepcopy(node)
    for key, value in settings.items():
        *path, name = key.split(".")
        functools.reduce(operator.getitem, path, node)[name] = value
    return node


def check_same_model(
    config: dict[str, Any], stored: dict[str, Any], program: str, free: Collection[str] = ()
) -> None:
    """Refuse a config whose model differs from the checkpoint's: settings both define with
    different values (a setting only one side knows is a newer option, not a conflict; the
    kernels that compute attention and how the weights were initialized may differ, and so
    may the flattened settings `free`: eval.py's `evaluation_options`)."""
    mine = flatten({key: config.get(key) for key in ARCHITECTURE}) | {
        "task.name": config["task"]["name"]
    }
    theirs = flatten({key: stored.get(key) for key in ARCHITECTURE}) | {
        "task.name": stored["task"]["name"]
    }
    differing = [
        key
        for key in mine
        if key in theirs
        and mine[key] != theirs[key]
        and key.split(".")[-1] not in (*DESCRIPTIVE, *NOT_WEIGHTS)
        and key not in free
    ]
    if differing:
        changes = ", ".join(f"{k}={theirs[k]} (not {mine[k]})" for k in differing)
        raise model_differs(program, changes)
