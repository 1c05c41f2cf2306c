"""What every logger calls a run and its group, so that W&B, TensorBoard and MLflow agree.

- group: the experiment's name, else in a multirun the sweep directory's name, else (a
  single run) the task's;
- name: the choices that set the run apart (`pe=rope,norm=l2`): its command-line overrides
  less paths, where output goes and how the run was cut short, at most NAME_LENGTH
  characters;
- tags: the run's tags plus its choice in each of CHOICES (`pe=rope`, `norm=l2`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from attnlab.config.groups import VARIANTS

CHOICES = (*VARIANTS, "task", "model", "block")  # the groups tagged
NAME_LENGTH = 128  # what W&B shows of a run's name
# overrides that say where output goes or how a run was cut short, not what ran
NOT_NAMING = re.compile(
    r"(hydra|paths|logger|callbacks|extras|experiment|hparams_search|debug|tags|ckpt_path|run_dir)"
    r"(\.|/|=)|trainer\.(limit_\w+|fast_dev_run|num_sanity_val_steps|log_every_n_steps)="
)


def default_group() -> str | None:
    """The experiment's name, else in a multirun the sweep directory's name."""
    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    experiment = hydra.runtime.choices.get("experiment")
    if experiment:
        return experiment
    return Path(hydra.sweep.dir).name if hydra.mode == RunMode.MULTIRUN else None


def run_name(overrides: Sequence[str]) -> str | None:
    """The overrides that set a run apart, "pe=rope,norm=l2": none that holds a path or says
    where output goes or how the run was cut short; at most NAME_LENGTH characters."""
    kept = [
        override.lstrip("+~")
        for override in overrides
        if not NOT_NAMING.match(override.lstrip("+~")) and "/" not in override.partition("=")[2]
    ]
    name = ",".join(kept)
    return name[: NAME_LENGTH - 1] + "…" if len(name) > NAME_LENGTH else name or None


def command_line() -> list[str]:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


@dataclass(frozen=True)
class RunLabels:
    """The settings every logger config takes to label a run (conf/logger/*.yaml), and what
    they come to: a setting left null takes the default the module docstring describes."""

    group: str | None
    name: str | None
    job_type: str | None  # the task
    tags: Sequence[str]

    @property
    def run_group(self) -> str | None:
        return self.group or default_group() or self.job_type

    @property
    def run_name(self) -> str | None:
        return self.name or run_name(command_line())

    @property
    def all_tags(self) -> list[str]:
        """The run's tags, then `group=option` for its choice in each of CHOICES."""
        chosen = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
        extra = [f"{group}={chosen[group]}" for group in CHOICES if chosen.get(group)]
        return [*self.tags, *extra]
