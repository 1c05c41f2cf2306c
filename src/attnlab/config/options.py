"""The options of every config group, read from the YAML files shipped inside the package.

`python -m attnlab.config.options` prints them as a Markdown table: docs/options.md's options table is
this output (a test keeps the two in sync). Tests and benchmarks build variants from the
same files with `variant`, so they exercise the defaults a run gets.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from attnlab.config.build import own_class, to_dict
from attnlab.config.groups import GROUPS, VARIANTS

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def options(group: str, nested: bool = False) -> list[str]:
    """Every option of a config group, from its YAML files; `nested`: those in its folders
    too, by path (task=synthetic/defaults), as the command line may choose them."""
    folder = CONF_DIR / group
    found = folder.rglob("*.yaml") if nested else folder.glob("*.yaml")
    return sorted(str(path.relative_to(folder).with_suffix("")) for path in found)


def variant(group: str, option: str, *overrides: str) -> dict[str, Any]:
    """The config node of one option (its YAML with defaults applied), plus overrides
    written relative to the group, e.g. variant("pe", "shaw", "max_relative_position=3")."""
    return copy.deepcopy(_variant(group, option, overrides))


# Groups whose options are composed alone (the YAML and its own defaults list), to the same
# node as inside the training config: their YAMLs refer to no other group. Every option of
# them is composed in one compose, each at a package of its own, paying Hydra's fixed cost
# once: 32 options in about 2 s instead of 11 s one by one. A model option may pick a block
# (model/gau), so it is composed in "train".
COMPOSED_ALONE = (*VARIANTS, "block")


@functools.cache
def _variant(group: str, option: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    alone = group in COMPOSED_ALONE
    if alone and not overrides and option in options(group):
        return _every_option_alone()[group][option]
    return _composed(
        None if alone else "train",
        [f"{'+' if alone else ''}{group}={option}", *(f"{group}.{o}" for o in overrides)],
        group,
    )


@functools.cache
def _every_option_alone() -> dict[str, dict[str, Any]]:
    """{group: {option: node}} for the groups of COMPOSED_ALONE, from one compose."""
    packages = [f"+{g}@every.{g}.{o}={o}" for g in COMPOSED_ALONE for o in options(g)]
    return _composed(None, packages, "every")


def _composed(config_name: str | None, overrides: list[str], key: str) -> dict[str, Any]:
    """Node `key` of a compose (resolved alone: the rest may refer to Hydra's runtime)."""
    GlobalHydra.instance().clear()  # compose outside any Hydra app this process ran
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides)
    GlobalHydra.instance().clear()
    return to_dict(cfg[key])


def causal_only(option: str, group: str = "pe") -> str | None:
    """Why <group>=<option> (a pe or a norm) works in causal self-attention only; None where
    it works anywhere."""
    return own_class(variant(group, option)["_target_"]).causal_only


def shrink(node: Any, max_len: int = 16) -> Any:
    """A copy of a config node with every length bound set to max_len (and factorized
    dense's a·b kept equal to it), so that tests and benchmarks stay small."""
    if isinstance(node, list):
        return [shrink(item, max_len) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: shrink(value, max_len) for key, value in node.items()}
    if "max_len" in node:
        node["max_len"] = max_len
    if "a" in node and "b" in node:
        node["a"], node["b"] = 4, max_len // 4
    return node


def first_comment(path: Path) -> str:
    """The first comment line of a YAML file that is not a Hydra directive."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ")
    raise ValueError(f"{path} has neither a description nor a leading comment to show")


def option_rows(group: str, conf: Path = CONF_DIR) -> list[tuple[str, str, str]]:
    """(option, description, paper) for each YAML of a group; options without a
    `description` key describe themselves in their first comment line."""
    rows = []
    for path in sorted((conf / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        description = node.get("description") or first_comment(path)
        cells = (f"`{group}={path.stem}`", description, node.get("paper", ""))
        rows.append(tuple(cell.replace("|", "\\|") for cell in cells))
    return rows


def options_table(conf: Path = CONF_DIR) -> str:
    lines = ["| option | what it is | source |", "|---|---|---|"]
    for group in GROUPS:
        lines += [f"| {o} | {d} | {p} |" for o, d, p in option_rows(group, conf)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(options_table())
