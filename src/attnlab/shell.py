"""The commands attnlab prints for the user to paste, and the values it hands to Hydra.

A printed command is quoted for the shell (`shlex.join`), and a `key=value` in it given to
train.py or eval.py is quoted for Hydra's override grammar too (`override`), so that a run
directory named `a b'c"d;$(touch x)` gives a line that, pasted into bash, runs attnlab on that
directory and nothing else. `value` reads such a value back as Hydra would.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

# what Hydra reads literally in an unquoted value (its grammar's unquoted characters)
BARE = re.compile(r"[\w./@%+-]+")


def command(*words: str | Path) -> str:
    """`words` as one line for the shell, each quoted where it needs to be."""
    return shlex.join(str(word) for word in words)


def train_command(*overrides: str) -> str:
    """The line that runs train.py with `overrides` (each already made by `override`)."""
    return command("python", "train.py", *overrides)


def hydra_quoted(text: str) -> str:
    """`text` as a value of Hydra's override grammar that reads back as `text`: bare where
    the grammar takes it as it is, else in single quotes, a quote and the backslashes before
    one escaped for Hydra, and `${` escaped for OmegaConf (which Hydra hands values to)."""
    if BARE.fullmatch(text) and value(f"key={text}") == text:  # not null, true, 1, ...
        return text
    # OmegaConf: n backslashes before `${` become 2n, then `\${` (a literal `${`)
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + r"\${", text)
    # Hydra: n backslashes before a quote or the closing quote become 2n; a quote is `\'`
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + r"\'", text)
    text = re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


def override(key: str, value: str | Path) -> str:
    """`key=value`, the value quoted for Hydra (`hydra_quoted`)."""
    return f"{key}={hydra_quoted(str(value))}"


def value(argument: str) -> object:
    """The value of the override `argument` (`key=value`) as Hydra and OmegaConf read it:
    quotes and escapes undone, `null` None; an interpolation is resolved as the run would."""
    parsed = OverridesParser.create().parse_override(argument).value()
    if isinstance(parsed, str) and "${" in parsed:
        return OmegaConf.create({"value": parsed})["value"]
    return parsed


def resume_command(run_dir: Path, *settings: str) -> str:
    """The line that resumes the run in `run_dir`, with `settings` (overrides)."""
    return train_command(override("run_dir", run_dir), *settings)
