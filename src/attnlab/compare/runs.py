"""What a run directory says about its run: overrides, config, metrics and state.

A run directory is one that Hydra gave a `.hydra/config.yaml` (every train.py run and every
job of a sweep). Its metrics are Lightning's `csv/metrics.csv`; its state is train.py's
`status.json` (see `attnlab.status`). Everything is read as data (YAML, CSV, JSON); a
resolver call in a saved config is text, never run.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

from attnlab import status
from attnlab.errors import ConfigError
from attnlab.logger.rows import logged_step
from attnlab.status import RunStatus

T = TypeVar("T", list, dict)
CONFIG = object()  # Run.read's key of the config itself

BY_POSITION = re.compile(r"(?P<stage>\w+)/acc_pos/(?P<position>\d+)")
Series = list[tuple[int, float]]  # (step, value)
# Overrides that say how a run was started or shown, not what it trains: a resumed sweep job
# gains ckpt_path and loses its display settings, and is still the same configuration.
HOW_STARTED = re.compile(r"ckpt_path|run_dir|extras\..+|callbacks\.progress_bar\..+")


@dataclass
class Run:
    path: Path
    name: str  # the path relative to the compared directory
    overrides: dict[str, str]  # key -> value of each command-line override
    saved: dict  # .hydra/config.yaml as data, nothing in it resolved
    metrics: dict[str, Series]  # numbers only: NaN is left out
    status: RunStatus | None
    nan: frozenset[str] = frozenset()  # metrics whose last logged value is NaN
    damaged: str = ""  # what of its files cannot be read (a sentence); "" when all can

    # what has been read of `saved`: its config, and each value selected in it; shared by the
    # copies dataclasses.replace makes of the run (with other overrides or another name)
    read: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def config(self) -> DictConfig:
        """The saved config, its resolver calls text (`literal_config`), made once."""
        if CONFIG not in self.read:
            self.read[CONFIG] = literal_config(self.saved)
        return self.read[CONFIG]

    def selected(self, key: str) -> object:
        """The config's value at `key` (None if absent), selected once."""
        if key not in self.read:
            self.read[key] = OmegaConf.select(
                self.config, key, default=None, throw_on_resolution_failure=False
            )
        return self.read[key]

    def setting(self, key: str) -> str | None:
        """A config value, e.g. "optimized_metric" or "task.metric_mode" (None if absent)."""
        value = self.selected(key)
        return None if value is None else as_text(value)

    def value(self, key: str) -> str:
        """Its value of an override key: the override, else what its config holds there (a
        group's name, so that a run left at the default norm reads `softmax`), else ""."""
        if key in self.overrides:
            return as_text(self.overrides[key])
        node = self.selected(key)
        found = self.setting(f"{key}.name") if isinstance(node, DictConfig) else self.setting(key)
        return found or ""

    @property
    def state(self) -> str:
        """completed, failed, interrupted, running, unfinished (a run that stopped without
        recording an end: killed, or older than status files), or damaged (`damaged`)."""
        if self.damaged:
            return "damaged"
        if self.status is None:
            return "unfinished"
        if self.status.state == "running" and not self.status.alive():
            return "unfinished"
        return self.status.state

    @property
    def fast_dev_run(self) -> bool:
        """A check that the configuration runs (debug=fast), not training."""
        return bool(self.selected("trainer.fast_dev_run") or False)

    @property
    def trained(self) -> bool:
        """Whether it trained, or is training: not a fast_dev_run, and not a run that ended
        before its first optimizer step (a config error, a crash on the first batch)."""
        return self.state == "running" or (not self.fast_dev_run and bool(self.steps()))

    def last(self, metric: str) -> float | None:
        series = self.metrics.get(metric)
        return series[-1][1] if series else None

    def best(self, metric: str, mode: str) -> float | None:
        values = [value for _, value in self.metrics.get(metric, [])]
        return (max if mode == "max" else min)(values) if values else None

    def steps(self) -> int | None:
        if self.status is not None and self.status.steps is not None:
            return self.status.steps
        return max((step for series in self.metrics.values() for step, _ in series), default=None)

    def by_position(self) -> dict[int, float]:
        """Accuracy by position: at test if the run was tested, else at its last validation."""
        found: dict[str, dict[int, float]] = {}
        for key, series in self.metrics.items():
            match = BY_POSITION.fullmatch(key)
            if match and series:
                found.setdefault(match["stage"], {})[int(match["position"])] = series[-1][1]
        return found.get("test") or found.get("val") or {}


def as_text(value: object) -> str:
    """A value as the table shows it: booleans as `true` and `false`, however they were
    written (a config holds True, a sweep's overrides True, a command line true)."""
    text = str(value)
    return text.lower() if text.lower() in ("true", "false") else text


def parse_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def read_logged(path: Path) -> dict[str, Series]:
    """Each metric's logged (step, value) pairs, in order, NaN included; a run still writing
    its file may leave a last row cut short, which is skipped."""
    logged: dict[str, Series] = {}
    try:
        with path.open(newline="", encoding="utf-8") as file:
            for row in csv.DictReader(file):
                step = logged_step(row.get("step") or "")
                if step is None:
                    continue  # a row cut short, or an edited step (`damage` names it)
                for key, value in row.items():
                    if key in ("step", "epoch") or not key or not value:
                        continue
                    try:
                        number = float(value)
                    except ValueError:
                        continue
                    logged.setdefault(key, []).append((step, number))
    except (FileNotFoundError, csv.Error, UnicodeDecodeError):
        pass  # no metrics, or what could be read of them (`damage` names what is wrong)
    return logged


def damage(run_dir: Path) -> str:
    """What of a run's status and metrics files cannot be read, in a sentence ("" if
    nothing): a status.json that is not a run's status; a metrics file without a step
    column, cut within a line after its run ended, or with a row (but a last one, which a run still writing may have cut short) with
    another number of fields than its header or a value that is not a number."""
    if found := status.damage(run_dir):
        return found
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return ""
    try:
        with path.open(newline="", encoding="utf-8") as file:
            header, *rows = list(csv.reader(file)) or [["step"]]
    except (csv.Error, UnicodeDecodeError) as error:
        return f"{path} cannot be read as CSV ({type(error).__name__})"
    if ended(run_dir) and not path.read_bytes().endswith(b"\n"):
        return f"{path} ends within a line after its run ended (it was cut short)"
    if "step" not in header:
        return f"{path} has no step column (its header is {','.join(header)[:80]!r})"
    for number, row in enumerate(rows[:-1], 2):
        if len(row) != len(header):
            return f"{path} line {number} has {len(row)} fields where its header has {len(header)}"
        for key, value in zip(header, row, strict=True):
            if key == "step" and value and logged_step(value) is None:
                return (
                    f"{path} line {number} holds {value!r} for step, which is not a count of steps"
                )
            if value and not is_number_text(value):
                return f"{path} line {number} holds {value!r} for {key}, which is not a number"
    return ""


def ended(run_dir: Path) -> bool:
    """Whether the run recorded its end (completed, failed or interrupted)."""
    found = status.read(run_dir)
    return found is not None and found.state != "running"


def is_number_text(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def numbers(logged: dict[str, Series]) -> dict[str, Series]:
    """The logged series without their NaN values; a metric only ever NaN is left out."""
    kept = {key: [(s, v) for s, v in series if not math.isnan(v)] for key, series in logged.items()}
    return {key: series for key, series in kept.items() if series}


def ending_in_nan(logged: dict[str, Series]) -> frozenset[str]:
    """The metrics whose last logged value is NaN (a length a model cannot take, a run that
    diverged)."""
    return frozenset(key for key, series in logged.items() if math.isnan(series[-1][1]))


class RunFileLoader(yaml.CSafeLoader):
    """libyaml's parser with OmegaConf's reading of scalars (`1e-3` is a float): a run's
    files as OmegaConf.load reads them, without its pure-Python parser (RESULTS.md's 253
    runs: 275 s to 100 s under cProfile)."""

    yaml_implicit_resolvers = get_yaml_loader().yaml_implicit_resolvers


EXPECTED = {list: "a list of text", dict: "a mapping"}


def load_yaml(path: Path, kind: type[T]) -> T:
    """A run file's data, or a ConfigError naming the file where it is not YAML, or not data
    of `kind` (overrides a list of text, a config a mapping)."""
    try:
        with path.open(encoding="utf-8") as file:
            data = yaml.load(file, Loader=RunFileLoader)  # a safe loader: plain data only
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        why = type(error).__name__
    else:
        if isinstance(data, kind) and (kind is not list or all(isinstance(x, str) for x in data)):
            return data
        why = f"it holds {type(data).__name__} data, not {EXPECTED[kind]}"
    raise ConfigError(
        f"{path} is damaged ({why}): restore it, or move its run out of the directory read"
    )


RESOLVER_CALL = re.compile(r"\$\{\s*[\w.-]+\s*:")  # ${oc.env:X}, ${unique:...}: code, not data


def _literal(value: object) -> object:
    if isinstance(value, dict):
        return {key: _literal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_literal(item) for item in value]
    if isinstance(value, str) and RESOLVER_CALL.search(value):
        return value.replace("${", "\\${")  # OmegaConf reads `\${` as the text `${`
    return value


def literal_config(config: dict) -> DictConfig:
    """A run's saved config with every resolver call made text: references between its keys
    (`${task.markers}`) still resolve, but reading a run directory never runs a resolver
    (`${oc.env:...}` would put the environment into a report, `${unique:...}` make a
    directory)."""
    return OmegaConf.create(_literal(config))


def read_run(run_dir: Path, root: Path) -> Run:
    hydra_dir = run_dir / ".hydra"
    logged = read_logged(run_dir / "csv" / "metrics.csv")
    overrides_file = hydra_dir / "overrides.yaml"
    overrides = load_yaml(overrides_file, list) if overrides_file.is_file() else []
    return Run(
        path=run_dir,
        name=str(run_dir.relative_to(root)) if run_dir != root else run_dir.name,
        overrides={
            key: value
            for key, value in map(parse_override, map(str, overrides))
            if not HOW_STARTED.fullmatch(key)
        },
        saved=load_yaml(hydra_dir / "config.yaml", dict),
        metrics=numbers(logged),
        status=status.read(run_dir),
        nan=ending_in_nan(logged),
        damaged=damage(run_dir),
    )


def job_order(path: Path) -> tuple:
    """Sweep jobs in number order (2 before 10), other directories by name."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts)


def find_runs(directory: Path) -> list[Run]:
    """Every run at or below `directory`."""
    run_dirs = {config.parent.parent for config in directory.rglob(".hydra/config.yaml")}
    return [read_run(run_dir, directory) for run_dir in sorted(run_dirs, key=job_order)]
