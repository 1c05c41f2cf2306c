"""train.py's and eval.py's command line, read in one place.

A command line is Hydra's: flags (`-m`, `--cfg job`, `--help`, ...) and overrides
(`group=option`, `key=value`, `+key=value`, `~group`). What attnlab decides from it before
Hydra runs reads it through these functions: whether to print the options, finish a sweep,
resume a run or evaluate a checkpoint, which directory a run writes in, and the checks of
`attnlab.runner.preflight`. So do the override lists a run stored (a checkpoint's, a sweep's
multirun.yaml), which have the same grammar. Each override is parsed by Hydra's own parser,
once; one that does not parse is left to Hydra, which says where.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

from attnlab import shell
from attnlab.errors import ConfigError

HELP = ("--help", "-h")
MULTIRUN = ("-m", "--multirun")


def given() -> list[str]:
    """This process's command line, less the program."""
    return sys.argv[1:]


def hand_to_hydra(args: Sequence[str]) -> None:
    """Make `args` the command line Hydra's app reads (sys.argv)."""
    sys.argv[1:] = list(args)


def flags(args: Sequence[str]) -> list[str]:
    """Hydra's flags among `args` (-m, --cfg, ...): what is Hydra's own business."""
    return [arg for arg in args if arg.startswith("-")]


def asks_help(args: Sequence[str]) -> bool:
    return any(arg in HELP for arg in args)


def is_multirun(args: Sequence[str]) -> bool:
    return any(arg in MULTIRUN for arg in args)


def is_override(arg: str) -> bool:
    """An override rather than a flag or a flag's value (the `job` of `--cfg job`)."""
    return not arg.startswith("-") and "=" in arg


@functools.lru_cache(maxsize=4096)
def _parsed(arg: str) -> Override | None:
    try:
        (override,) = OverridesParser.create().parse_overrides([arg])
    except Exception:
        return None  # a syntax error: Hydra says where
    return override


def parsed(args: Sequence[str]) -> list[tuple[str, Override]]:
    """Each override of `args` that parses, with its text."""
    return [(arg, o) for arg in args if is_override(arg) and (o := _parsed(arg)) is not None]


def parse_all(overrides: Sequence[str]) -> list[Override]:
    """Every override of a list that holds nothing else (what a run stored), in order: one
    that does not parse raises Hydra's error."""
    return OverridesParser.create().parse_overrides(list(overrides))


def value(args: Sequence[str], key: str) -> str | None:
    """The value the last `key=...` of `args` gives, as Hydra reads it (`run_dir='a b'` is
    `a b`, `ckpt_path=null` None); a value that is no string (a sweep) as it was typed."""
    given = [arg for arg in args if arg.startswith(f"{key}=")]
    if not given:
        return None
    try:
        read = shell.value(given[-1])
    except Exception as error:
        raise ConfigError(
            f"{given[-1]} does not parse as an override ({str(error).splitlines()[0]}): quote "
            f"its value for Hydra, {key}='...'"
        ) from None
    return read if read is None or isinstance(read, str) else given[-1].split("=", 1)[1]


def without(args: Sequence[str], key: str) -> list[str]:
    """`args` less every `key=...`."""
    return [arg for arg in args if not arg.startswith(f"{key}=")]


def chooses(args: Sequence[str], key: str) -> bool:
    """Whether `args` give `key` a value (`key=...`, not a flag): a given ckpt_path=null
    chooses no checkpoint."""
    return value(args, key) not in (None, "null")
