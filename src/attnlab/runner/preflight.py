"""Checks of a command line before Hydra runs it, for mistakes Hydra reports unhelpfully.

A misspelled setting (`model.dmodel=64`) makes Hydra suggest `+model.dmodel=64`, which would
add a setting that nothing reads; here it is an error that names the settings there are. So
is a group that does not exist, added with `+` (`+optimizer=adam`), which Hydra would take
as a new top-level setting. An argument of Lightning's Trainer that conf/trainer does not
list (`trainer.accumulate_grad_batches=2`) is a setting all the same: the Trainer's
signature says so, and the override is passed on as `++trainer.accumulate_grad_batches=2`.
A group option that does not exist (`pe=ropee`) names the group's options and the closest,
where Hydra would print its search path. A setting that moved into a node (`task.data.max_tokens`, now `task.data.batching.max_tokens`)
is an error that names its new spelling. An override a resumed or evaluated run stored, of a
setting this version no longer has, is an error that says the run's file supplied it.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import ChoiceSweep
from omegaconf import DictConfig, OmegaConf

from attnlab.config.groups import GROUPS
from attnlab.config.options import CONF_DIR, options
from attnlab.errors import ConfigError
from attnlab.runner.command_line import flags, parse_all, parsed


def check_added_groups(args: list[str]) -> None:
    """Raise a ConfigError for `+name=...` where attnlab has no config group `name`."""
    for arg, override in parsed(args):
        key = override.key_or_group
        added = override.is_add() or override.is_force_add()
        if added and "." not in key and key not in GROUPS:
            raise ConfigError(
                f"{arg} adds a setting that nothing reads: attnlab has no config group {key} "
                f"(the groups are {', '.join(GROUPS)})"
            )


CHOSEN_BY_HYDRA = ("hydra", "hydra/launcher")  # Hydra's plugins add options of their own


def check_group_choices(args: list[str]) -> None:
    """Raise a ConfigError, with the closest option, for `group=option` (or a sweep of
    options) where the group has no such option: Hydra would list its search path."""
    for _, override in parsed(args):
        group = override.key_or_group
        if group not in GROUPS or group in CHOSEN_BY_HYDRA or override.package is not None:
            continue
        if override.is_delete() or not (CONF_DIR / group).is_dir():
            continue
        if override.is_sweep_override():
            if not isinstance(override.value(), ChoiceSweep):
                continue  # a range or glob: Hydra expands it
            chosen = list(override.sweep_string_iterator())
        else:
            chosen = [override.get_value_element_as_str()]
        known = options(group, nested=True)
        for option in chosen:
            if option != "null" and option not in known:
                close = difflib.get_close_matches(option, known, n=1)
                hint = f" (did you mean {group}={close[0]}?)" if close else ""
                raise ConfigError(
                    f"{group}={option} is not an option{hint}: {group} has {', '.join(known)}"
                )


def usage(config_name: str = "train") -> str:
    """What `python train.py --help` prints: the command's shape, each config group with its
    options and default (read from the YAML files alone: no composition, no torch)."""
    import yaml

    chosen: dict[str, str] = {}
    for entry in yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            chosen[group.removeprefix("optional ")] = str(option).lower()
    lines = [
        f"python {config_name}.py [-m] [group=option ...] [key=value ...]",
        "",
        "Config groups and their options (-m sweeps a comma list of them):",
    ]
    for group in GROUPS:
        if group not in CHOSEN_BY_HYDRA and (CONF_DIR / group).is_dir():
            default = chosen.get(group, "none")
            lines.append(
                f"  {group}: {', '.join(options(group, nested=True))} (default: {default})"
            )
    lines += [
        "",
        "Any setting of the composed config is key=value (model.d_model=64, trainer.max_steps=200);",
        f"`python {config_name}.py --cfg job [overrides]` prints the composed config, and",
        f"`python {config_name}.py run_dir=<run or sweep directory>` resumes one. Each option is",
        "described in docs/options.md; Hydra's own flags: --hydra-help.",
    ]
    return "\n".join(lines)


@functools.cache
def trainer_parameters() -> set[str]:
    import inspect

    from lightning.pytorch import Trainer

    return set(inspect.signature(Trainer.__init__).parameters) - {"self"}


def moved_into(parent: DictConfig, parent_key: str, leaf: str) -> list[str]:
    """Where a setting `leaf` of `parent` lives now that it moved into one of its nodes:
    under its name (`max_tokens` -> `batching.max_tokens`), or with the node's name as its
    prefix dropped (`tokenizer_pairs` -> `tokenizer.pairs`)."""
    found = []
    for key, child in parent.items_ex(resolve=False):
        if not isinstance(child, DictConfig):
            continue
        for name in (leaf, leaf.removeprefix(f"{key}_")):
            if name in child:
                found.append(f"{parent_key}.{key}.{name}")
                break
    return found


def check_setting_keys(
    args: list[str], config_name: str, stored: Collection[str] = ()
) -> list[str]:
    """`args`, each Trainer argument the trainer config does not list made `++trainer.…`;
    raise a ConfigError for an override of a setting, or an added group, that does not
    exist. `stored`: the arguments read from a run's checkpoint, not typed by the user."""
    check_added_groups(args)
    check_group_choices(args)
    if flags(args):  # -m, --help, --cfg: Hydra's own business
        return args
    try:
        overrides = parse_all(args)
    except Exception:
        return args  # a syntax error: Hydra says where
    settings = [
        o for o in overrides
        if "." in o.key_or_group and not o.key_or_group.startswith("hydra.")
        and not (o.is_add() or o.is_force_add() or o.is_delete() or o.package is not None)
    ]  # fmt: skip
    if not settings:
        return args
    choices = [arg for arg, o in zip(args, overrides, strict=True) if "." not in o.key_or_group]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=choices)
    except Exception:
        return args  # a bad choice: Hydra lists the options
    finally:
        GlobalHydra.instance().clear()
    trainer_arguments = []
    for override in settings:
        parent_key, _, leaf = override.key_or_group.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False)
        if isinstance(parent, DictConfig) and leaf in parent:
            continue
        if parent_key == "trainer" and leaf in trainer_parameters():
            trainer_arguments.append(override.input_line)
            continue
        if override.input_line in stored:
            raise ConfigError(
                f"the run's checkpoint stores the override {override.input_line}, and "
                f"{override.key_or_group} is not a setting of this version of attnlab: "
                "resume or evaluate the run with the version that trained it"
            )
        if not isinstance(parent, DictConfig):
            raise ConfigError(f"{override.key_or_group} is not a setting: there is no {parent_key}")
        moved = moved_into(parent, parent_key, leaf)
        if moved:
            raise ConfigError(f"{override.key_or_group} is now spelled {' or '.join(moved)}")
        names = sorted(str(key) for key in parent)
        if parent_key == "trainer":  # what the Trainer takes, listed or not
            names = sorted({*names, *trainer_parameters()} - {"_target_"})
        close = difflib.get_close_matches(leaf, names, n=1)
        hint = f" (did you mean {parent_key}.{close[0]}?)" if close else ""
        raise ConfigError(
            f"{override.key_or_group} is not a setting{hint}: {parent_key} has {', '.join(names)}"
        )
    return [f"++{arg}" if arg in trainer_arguments else arg for arg in args]
