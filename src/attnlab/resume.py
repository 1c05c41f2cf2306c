"""Rebuilding a run from what it stored: a checkpoint's overrides, a run directory.

`eval.py ckpt_path=...` and `train.py ckpt_path=...` / `train.py run_dir=...` put the
overrides the run was trained with ahead of the command line's, so that the model is the
one trained. Those overrides are read from a file, so they pass an allow-list first: group
choices (`pe=rope`, `~logger`) and plain values of the run's own settings (`model.d_model=64`,
`task.data.dir=...`, `paths.data_dir=...`). Anything that could name code to run
(`_target_`, dict values) or reach into the machinery (`hydra.*`, `callbacks.*`,
`logger.*`) is left out, and the command says so on stderr.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

from attnlab.config import ARCHITECTURE, DESCRIPTIVE, ConfigError, flatten

RECORD_KEY = "attnlab"  # checkpoint entry holding the run's overrides and resolved config
LAST = "last.ckpt"  # the latest state of a run, in <run dir>/checkpoints/

GROUPS = (
    "task", "pe", "norm", "synthesizer", "model", "block", "trainer", "logger", "callbacks",
    "extras", "experiment", "hparams_search", "debug",
)  # fmt: skip
SETTINGS = (
    "task", "pe", "norm", "synthesizer", "model", "block", "trainer", "decode", "paths", "extras",
)  # fmt: skip
TOP_VALUES = ("seed", "tags", "train", "test", "optimized_metric")
OPTION_NAME = re.compile(r"[\w-]+")
PRIMITIVE = (str, int, float, bool, type(None))


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file as plain data and tensors (`weights_only`: reading it runs no code),
    or a ConfigError saying what is wrong with it."""
    import torch

    text = str(path)
    if "://" in text:
        raise ConfigError(f"{text} is a URL: download the checkpoint and pass its local path")
    if not Path(text).is_file():
        raise ConfigError(f"{text} is not a file: pass a checkpoint written by train.py")
    try:
        checkpoint = torch.load(text, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise ConfigError(
            f"{text} cannot be read as a checkpoint ({type(error).__name__}: {reason}): it is "
            "truncated, not a checkpoint, or holds objects other than tensors and plain data"
        ) from None
    if not isinstance(checkpoint, dict) or RECORD_KEY not in checkpoint:
        raise ConfigError(f"{text} holds no attnlab run record: was it written by train.py?")
    return checkpoint


def _plain(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(item, PRIMITIVE) for item in value)
    return isinstance(value, PRIMITIVE)


def _allowed(override: Override) -> bool:
    key = override.key_or_group
    parts = key.split(".")
    if any(part.startswith("_") for part in parts) or override.is_sweep_override():
        return False
    if len(parts) == 1 and key in GROUPS:  # a group choice, or deleting one
        if override.is_delete():
            return True
        value = override.value()
        return isinstance(value, str) and OPTION_NAME.fullmatch(value) is not None
    if (parts[0] in SETTINGS and len(parts) > 1) or key in TOP_VALUES:
        return override.is_delete() or _plain(override.value())
    return False


def allowed_overrides(stored: list[str], source: str) -> list[str]:
    """The stored overrides that may be applied again; the others are logged and left out."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(stored))
    except Exception as error:
        raise ConfigError(f"{source} stores overrides that do not parse ({error})") from None
    kept = [text for text, override in zip(stored, parsed, strict=True) if _allowed(override)]
    left_out = [text for text in stored if text not in kept]
    if left_out:
        # before Hydra has set up logging: straight to stderr
        print(
            f"attnlab: not reusing these overrides of {source}: {' '.join(left_out)}",
            file=sys.stderr,
        )
    return kept


def argument(args: list[str], key: str) -> str | None:
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{key}=")]
    return values[-1] if values else None


def run_directory(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint was written in (<run>/checkpoints/x.ckpt), if any."""
    run_dir = checkpoint.resolve().parent.parent
    is_run = checkpoint.resolve().parent.name == "checkpoints" and (run_dir / ".hydra").is_dir()
    return run_dir if is_run else None


def stored_record(args: list[str]) -> dict[str, Any] | None:
    """The run record of the checkpoint `args` name (ckpt_path=...), if they name one."""
    path = argument(args, "ckpt_path")
    return None if path in (None, "null") else read_checkpoint(path)[RECORD_KEY]


def evaluation_arguments(args: list[str]) -> list[str]:
    """eval.py's command line: the checkpoint's allowed overrides, then `args`."""
    record = stored_record(args)
    if record is None:
        return args
    return [*allowed_overrides(record["overrides"], "the checkpoint"), *args]


def training_arguments(args: list[str]) -> list[str] | None:
    """The overrides of a resumed run (None when train.py's command line resumes nothing).
    `run_dir=<run>` stands for `ckpt_path=<run>/checkpoints/last.ckpt`; a checkpoint inside a
    run directory continues that run, in that directory."""
    run_dir = argument(args, "run_dir")
    if run_dir is not None:
        checkpoint = Path(run_dir) / "checkpoints" / LAST
        if not checkpoint.is_file():
            raise ConfigError(
                f"run_dir={run_dir} has no checkpoints/{LAST} to resume from: pass the directory "
                "of a run that train.py wrote (logs/<task>/runs/<time>)"
            )
        args = [a for a in args if not a.startswith("run_dir=")] + [f"ckpt_path={checkpoint}"]
    if any(a.startswith("-") for a in args) and argument(args, "ckpt_path") not in (None, "null"):
        raise ConfigError(
            "ckpt_path= resumes one run, so it takes no flags (-m, --cfg, ...): run each "
            "resumed job on its own"
        )
    record = stored_record(args)
    if record is None:
        return None
    resumed = [*allowed_overrides(record["overrides"], "the checkpoint"), *args]
    directory = run_directory(Path(argument(args, "ckpt_path")))
    return resumed + ([f"hydra.run.dir={directory}"] if directory else [])


def check_same_model(config: dict[str, Any], stored: dict[str, Any], program: str) -> None:
    """Refuse a config whose model differs from the checkpoint's: settings both define with
    different values (a setting only one side knows is a newer option, not a conflict)."""
    mine = flatten({key: config.get(key) for key in ARCHITECTURE}) | {
        "task.name": config["task"]["name"]
    }
    theirs = flatten({key: stored.get(key) for key in ARCHITECTURE}) | {
        "task.name": stored["task"]["name"]
    }
    differing = [
        key
        for key in mine
        if key in theirs and mine[key] != theirs[key] and key.split(".")[-1] not in DESCRIPTIVE
    ]
    if differing:
        changes = ", ".join(f"{k}={theirs[k]} (not {mine[k]})" for k in differing)
        raise ConfigError(
            f"{program} uses the model stored in the checkpoint, which has {changes}: drop the "
            "overrides that change the model, or pass a checkpoint of the model you mean"
        )
