"""Rebuilding a run from what it stored: a checkpoint's overrides, a run directory.

`eval.py ckpt_path=...` and `train.py ckpt_path=...` / `train.py run_dir=...` put the
overrides the run was trained with ahead of the command line's, so that the model is the
one trained. Those overrides are read from a file, so they pass an allow-list first: group
choices (`pe=rope`, `~logger`), literal values of the run's own settings
(`model.d_model=64`, `task.data.dir=/data/multi30k`), including lists of flat records of
them (`model.schedule.pattern=[{pe:pe,window:8},{pe:nope}]`), numbers, booleans or null set on
the few callback options of RESUMED_CALLBACK_OPTIONS (`callbacks.early_stopping.min_delta=0.05`:
a resumed run stops by the rule it started with), and the callbacks of RESUMED_CALLBACKS_OFF
turned off (`callbacks.early_stopping=null`). Left out, and named on stderr: anything that
could name code to run (`_target_` or any other key starting with `_`, a record inside a
record, an interpolation or resolver such as `${oc.env:HOME}` anywhere in a value), reach into
the machinery (`hydra.*`, `logger.*`, any other callback option, a callback added or any other
deleted), or choose where output goes (`paths.*`, `*.dirpath`, ..., as a key or inside a record): a file never decides that.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.types import Override
from omegaconf import OmegaConf

from attnlab import shell
from attnlab.config.build import declared, flatten
from attnlab.config.groups import ARCHITECTURE, GROUPS, OUTPUT
from attnlab.errors import ConfigError  # fmt: skip
from attnlab.runner import command_line
from attnlab.stored import RECORD_KEY, read_checkpoint

LAST = "last.ckpt"  # the latest state of a run, in <run dir>/checkpoints/
# the best weights beside it, named by epoch or, in a run that validates by steps, by step
# (callbacks.model_checkpoint.filename)
BEST = ("epoch_*.ckpt", "step_*.ckpt")

# what a stored override may choose (never where output goes) and may set a value inside
CHOSEN = tuple(group for group in GROUPS if group not in OUTPUT)
SETTINGS = ("task", *ARCHITECTURE, "trainer", "decode", "extras")
OUTPUT_KEYS = ("default_root_dir", "cache_dir", "dirpath", "save_dir", "output_dir", "log_dir")
DATA_LOCATIONS = ("task.data.dir", "task.data.file", "task.data.test_src", "task.data.test_tgt")
# how a run was trained, not what it learned: an evaluation never takes these from the run
TRAINING_ONLY = ("trainer", "callbacks", "debug", "hparams_search", "train", "test")
TOP_VALUES = ("seed", "tags", "train", "test", "optimized_metric")
OPTION_NAME = re.compile(r"[\w-]+")
PRIMITIVE = (str, int, float, bool, type(None))
# the callback options a stored override may set again, to a number, a boolean or null: how a
# run stops and saves its state, never what a checkpoint keeps or where anything goes
RESUMED_CALLBACK_OPTIONS = {
    "early_stopping": ("patience", "min_delta"),
    "latest": ("every_n_minutes", "every_n_steps", "keep_when_done"),
    "progress_bar": ("refresh_rate",),
}
# the callbacks a stored override may turn off: how a run stops, never what it saves
RESUMED_CALLBACKS_OFF = ("early_stopping",)
NUMERIC = (int, float, bool, type(None))
# what a resume takes from the run's saved state, whatever the command line says: AdamW's
# settings (its parameter groups, and the scheduler's base rate) and early stopping's patience
RESTORED = (
    *(f"task.optim.{name}" for name in ("lr", "weight_decay", "betas", "eps")),
    "callbacks.early_stopping.patience",
)


def _primitive(value: Any) -> bool:
    """A value OmegaConf would not evaluate (no `${...}`)."""
    return isinstance(value, PRIMITIVE) and not (isinstance(value, str) and "${" in value)


def _record(value: Any) -> bool:
    """A flat record of primitives under plain names (`{pe: pe, window: 8}`): no `_target_`
    or other key Hydra's instantiate reads, no key saying where output goes, no record
    inside it."""
    return isinstance(value, dict) and all(
        isinstance(key, str) and OPTION_NAME.fullmatch(key) is not None
        and not key.startswith("_") and key not in OUTPUT_KEYS and _primitive(item)
        for key, item in value.items()
    )  # fmt: skip


def _literal(value: Any) -> bool:
    """A primitive, a flat record, or a list of them."""
    items = value if isinstance(value, list) else [value]
    return all(_primitive(item) or _record(item) for item in items)


def _allowed(override: Override) -> bool:
    key = override.key_or_group
    parts = key.split(".")
    if any(part.startswith("_") for part in parts) or override.is_sweep_override():
        return False
    if len(parts) == 1 and key in CHOSEN:  # a group choice, or deleting one
        package = override.package
        if package not in (None, "") and package.split(".")[0] != key:
            return False  # `pe@pe.base=rope` places an option inside its group, nowhere else
        value = override.value()
        if override.is_delete() and value is None:
            return True
        return isinstance(value, str) and OPTION_NAME.fullmatch(value) is not None
    if parts[-1] in OUTPUT_KEYS:
        return False
    if parts[0] == "callbacks":  # an option of a callback the config has, never a new one
        edits = not (override.is_add() or override.is_force_add() or override.is_delete())
        if len(parts) == 2 and parts[1] in RESUMED_CALLBACKS_OFF:
            return edits and override.value() is None
        named = len(parts) == 3 and parts[2] in RESUMED_CALLBACK_OPTIONS.get(parts[1], ())
        return named and edits and isinstance(override.value(), NUMERIC)
    if (parts[0] in SETTINGS and len(parts) > 1) or key in TOP_VALUES:
        return _literal(override.value())
    return False


def allowed_overrides(stored: list[str], source: str) -> list[str]:
    """The stored overrides that may be applied again; the others are logged and left out."""
    try:
        parsed = command_line.parse_all(stored)
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


def best_files(checkpoints: Path) -> list[Path]:
    """The best checkpoints in a run's `checkpoints` directory, by either name."""
    return sorted(path for pattern in BEST for path in checkpoints.glob(pattern))


def run_directory(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint was written in (<run>/checkpoints/x.ckpt), links
    followed, if any."""
    return named_run_directory(checkpoint.resolve())


def named_run_directory(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint is named under (<run>/checkpoints/x.ckpt), links not
    followed, if any: a fork's, where `run_directory` follows its links to the run it copies."""
    path = Path(os.path.abspath(checkpoint))
    run_dir = path.parent.parent
    return run_dir if path.parent.name == "checkpoints" and (run_dir / ".hydra").is_dir() else None


def stored_record(args: list[str]) -> dict[str, Any] | None:
    """The run record of the checkpoint `args` name (ckpt_path=...), if they name one."""
    path = command_line.value(args, "ckpt_path")
    return None if path in (None, "null") else read_checkpoint(path)[RECORD_KEY]


def absolute_locations(overrides: list[str], root: str | Path) -> list[str]:
    """`overrides` with each relative data location (task.data.dir, ...) made absolute
    against `root`, the directory the run was launched from, so that a run read back from
    another directory finds the same files, or none."""
    located = []
    for text, override in zip(overrides, command_line.parse_all(overrides), strict=True):
        value = override.value() if override.key_or_group in DATA_LOCATIONS else None
        if isinstance(value, str) and not Path(value).is_absolute() and "'" not in value:
            prefix = text[: text.index(override.key_or_group)]
            text = f"{prefix}{override.key_or_group}='{(Path(root) / value).resolve()}'"
        located.append(text)
    return located


def stored_locations(stored: list[str], args: list[str]) -> list[tuple[str, Any]]:
    """The data locations (key, value) that `stored` sets and `args` do not: what a run
    rebuilt from its checkpoint reads because the checkpoint says so."""
    given = {override.key_or_group for override in command_line.parse_all(args)}
    return [
        (override.key_or_group, override.value())
        for override in command_line.parse_all(stored)
        if override.key_or_group in DATA_LOCATIONS and override.key_or_group not in given
    ]


def check_data_present(stored: list[str], args: list[str], program: str) -> None:
    """Refuse a stored data location that is gone, unless `args` give another: reading what
    now happens to be elsewhere would evaluate (or train on) other data."""
    for key, value in stored_locations(stored, args):
        if isinstance(value, str) and not Path(value).exists():
            raise ConfigError(
                f"the run was trained with {key}={value}, which is gone: pass {key}=<where "
                f"that data is now> to {program}"
            )


def stored_overrides(record: dict[str, Any]) -> list[str]:
    """The record's overrides that may be applied again, data locations made absolute, and
    the data seed or generator options of a run recorded before those settings existed."""
    kept = allowed_overrides(record["overrides"], "the checkpoint")
    located = absolute_locations(kept, record["config"]["paths"]["root_dir"])
    config = record["config"]
    return respelled(located, config) + earlier_data_seed(config) + earlier_generator(config)


def for_callbacks_chosen(stored: list[str], args: list[str]) -> list[str]:
    """`stored` less its callback options when `args` choose other callbacks (`callbacks=
    default`, `~callbacks`): those options may be of a callback the new choice lacks."""
    choice = command_line.value(args, "callbacks")
    chosen = "~callbacks" if "~callbacks" in args else choice and f"callbacks={choice}"
    same = choice is not None and choice == command_line.value(stored, "callbacks")
    if chosen is None or same:
        return stored
    options = [o.key_or_group.startswith("callbacks.") for o in command_line.parse_all(stored)]
    if any(options):
        dropped = " ".join(text for text, drop in zip(stored, options, strict=True) if drop)
        print(f"attnlab: {chosen} on the command line replaces {dropped}", file=sys.stderr)
    return [text for text, drop in zip(stored, options, strict=True) if not drop]


def respelled(overrides: list[str], config: dict[str, Any]) -> list[str]:
    """`overrides` of a sequence-to-sequence run recorded before its data settings moved into
    nodes, in today's spelling (task.data.max_tokens=… -> task.data.batching.max_tokens=…)."""
    data = (config.get("task") or {}).get("data") or {}
    moved = declared(data.get("_target_"), "earlier_spellings", {})
    if not moved or "batching" in data:
        return overrides
    spelled = []
    for text in overrides:
        prefix, key, value = re.match(r"([+~]*)([^=]*)(.*)", text, re.S).groups()  # type: ignore[union-attr]
        spelled.append(f"{prefix}{moved.get(key, key)}{value}")
    return spelled


def earlier_data_seed(config: dict[str, Any]) -> list[str]:
    """`task.data.data_seed=<its seed>` for a run recorded before that setting existed, whose
    data (dialogue's split of conversations, a train_size sample) was drawn with its
    task.data.seed: evaluated or resumed, it keeps the data it was trained and tested on."""
    data = (config.get("task") or {}).get("data") or {}
    seed = data.get("seed")
    seeded = declared(data.get("_target_"), "data_seed_added", False)
    if seeded and "data_seed" not in data and type(seed) is int:
        return [f"task.data.data_seed={seed}"]
    return []


def earlier_generator(config: dict[str, Any]) -> list[str]:
    """For a run recorded before an option of its task's generator existed (mqar's layout),
    the value it ran with, so that it is evaluated or resumed on the task it learned."""
    generator = ((config.get("task") or {}).get("data") or {}).get("generator") or {}
    earlier = declared(generator.get("_target_"), "earlier_defaults", {})
    return [f"task.data.generator.{k}={v}" for k, v in earlier.items() if k not in generator]


def evaluation_arguments(args: list[str]) -> list[str]:
    """eval.py's command line: the checkpoint's allowed overrides, less how it was trained
    (trainer settings and limits, callbacks, debug configs), then `args`."""
    record = stored_record(args)
    if record is None:
        return args
    kept = stored_overrides(record)
    training = [o.key_or_group.split(".")[0] in TRAINING_ONLY for o in command_line.parse_all(kept)]
    stored = [text for text, drop in zip(kept, training, strict=True) if not drop]
    if any(training):
        dropped = " ".join(text for text, drop in zip(kept, training, strict=True) if drop)
        print(
            f"attnlab: evaluating without the run's training settings: {dropped}", file=sys.stderr
        )
    check_same_task(record, args, "eval.py")
    check_data_present(stored, args, "eval.py")
    for key, value in stored_locations(stored, args):  # never read without saying so
        print(
            f"attnlab: reading {key}={value}, the run's (from its checkpoint): pass "
            f"{key}=<another> to evaluate on other data",
            file=sys.stderr,
        )
    return [*stored, *args]


def training_arguments(args: list[str]) -> list[str] | None:
    """The overrides of a resumed run (None when train.py's command line resumes nothing).
    `run_dir=<run>` stands for `ckpt_path=<run>/checkpoints/last.ckpt`; a checkpoint inside a
    run directory continues that run, in that directory."""
    run_dir = command_line.value(args, "run_dir")
    if run_dir is not None:
        checkpoint = Path(run_dir) / "checkpoints" / LAST
        if not checkpoint.is_file():
            raise no_checkpoint(Path(run_dir))
        args = command_line.without(args, "run_dir")
        args.append(shell.override("ckpt_path", checkpoint))
    if command_line.flags(args) and command_line.chooses(args, "ckpt_path"):
        raise ConfigError(
            "ckpt_path= resumes one run, so it takes no flags (-m, --cfg, ...): run each "
            "resumed job on its own"
        )
    path = command_line.value(args, "ckpt_path")
    if path in (None, "null"):
        return None
    checkpoint = read_checkpoint(path)
    if "optimizer_states" not in checkpoint:
        raise ConfigError(
            f"{path} holds the weights only (a run's best checkpoint), not a training state to "
            f"resume: resume from checkpoints/{LAST} of its run, or evaluate it with eval.py"
        )
    stored = stored_overrides(checkpoint[RECORD_KEY])
    check_same_task(checkpoint[RECORD_KEY], args, "train.py")
    check_data_present(stored, args, "train.py")
    resumed = [*for_callbacks_chosen(stored, args), *args]
    directory = run_directory(Path(command_line.value(args, "ckpt_path")))
    return resumed + ([shell.override("hydra.run.dir", directory)] if directory else [])


def check_restored(resumed: list[str]) -> None:
    """Refuse a resume whose settings differ from the run's where its saved state decides
    (RESTORED): the optimizer and early stopping go on as saved, and the run's record would
    name a value it never trained with."""
    from attnlab.runner.job import compose_run

    stored = flatten(
        read_checkpoint(command_line.value(resumed, "ckpt_path"))[RECORD_KEY]["config"]
    )
    composed = compose_run("train", resumed)
    for key in RESTORED:
        chosen = OmegaConf.select(composed, key, default=None)
        chosen = OmegaConf.to_object(chosen) if OmegaConf.is_config(chosen) else chosen
        if key in stored and chosen is not None and chosen != stored[key]:
            raise ConfigError(
                f"a resume goes on with the optimizer and early stopping the run saved, which "
                f"keep {key}={stored[key]} (not {chosen}): drop that setting, or start a new run "
                f"with it; a resume cannot change {', '.join(RESTORED)}"
            )


def no_checkpoint(run_dir: Path) -> ConfigError:
    """What to do with `run_dir=` of a directory without last.ckpt: a run stopped before its
    first save (its status and overrides written, no state) is started again, in a new
    directory, by its own command line; anything else is not a run to resume."""
    from attnlab import status

    recorded = status.read(run_dir)
    ran = run_dir / ".hydra" / "overrides.yaml"
    try:
        overrides = OmegaConf.to_container(OmegaConf.load(ran)) if ran.is_file() else None
    except Exception:
        overrides = None  # unreadable: not a record to start it again from
    if recorded is None or recorded.state == "completed" or not isinstance(overrides, list):
        return ConfigError(
            f"run_dir={run_dir} has no checkpoints/{LAST} to resume from: pass the directory "
            "of a run that train.py wrote (logs/<task>/runs/<time>), or of a -m sweep "
            "(logs/<task>/multiruns/<time>)"
        )
    again = [str(text) for text in overrides if not str(text).startswith("hydra.run.dir=")]
    return ConfigError(
        f"{run_dir} has no checkpoints/{LAST} yet: its run was stopped before its first save, "
        f"so there is nothing to resume; start it again, in a new directory, with: "
        f"{shell.train_command(*again)}"
    )


def check_same_task(record: dict[str, Any], args: list[str], program: str) -> None:
    """Refuse a command line that names another task than the checkpoint's, before the
    checkpoint's overrides (which may be of settings the other task lacks) are composed."""
    chosen, stored = command_line.value(args, "task"), record["config"]["task"]["name"]
    if chosen is not None and chosen != stored:
        raise model_differs(program, f"task.name={stored} (not {chosen})")


def model_differs(program: str, changes: str) -> ConfigError:
    return ConfigError(
        f"{program} uses the model stored in the checkpoint, which has {changes}: drop the "
        "overrides that change the model, or pass a checkpoint of the model you mean"
    )
