"""A run composed from an explicit list of overrides, set up as Hydra sets up a job.

`train.py` and `eval.py` are Hydra apps reading their overrides from the command line. A run
rebuilt from a checkpoint (eval.py, a resumed train.py) puts the checkpoint's stored
overrides ahead of the command line's. That list is composed with Hydra's compose API, and
the job gets what Hydra gives one: its directory (`hydra.run.dir`), `hydra.runtime`, its
logging (`<name>.log` there) and `.hydra/{config,hydra,overrides}.yaml`.

What a job knows of itself from Hydra: whether it is one of a -m sweep's, and the overrides
it was launched with.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.config.options import CONF_DIR

T = TypeVar("T")


def compose_run(config_name: str, overrides: list[str]) -> DictConfig:
    """The config `config_name` with `overrides`, the `hydra` node included."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name=config_name):
        return compose(config_name, overrides=overrides, return_hydra_config=True)


def job_config(cfg: DictConfig) -> DictConfig:
    """The config a task sees: without the `hydra` node."""
    task = cfg.copy()
    with open_dict(task):
        del task["hydra"]
    return task


def run_composed(config_name: str, overrides: list[str], task: Callable[[DictConfig], T]) -> T:
    """Run `task` on the composed config as a single Hydra job (see the module docstring)."""
    cfg = compose_run(config_name, overrides)
    output_dir = Path(str(cfg.hydra.run.dir)).resolve()  # made by the ${unique:} resolver
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.runtime.cwd = os.getcwd()
        cfg.hydra.mode = RunMode.RUN
    HydraConfig.instance().set_config(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
    job = job_config(cfg)
    if cfg.hydra.output_subdir is not None:
        saved = output_dir / cfg.hydra.output_subdir
        saved.mkdir(exist_ok=True)
        OmegaConf.save(job, saved / "config.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": cfg.hydra}), saved / "hydra.yaml")
        OmegaConf.save(cfg.hydra.overrides.task, saved / "overrides.yaml")
    return task(job)


def is_sweep_job(output_dir: Path) -> bool:
    """Whether `output_dir` is a job's directory in a -m sweep's (multirun.yaml beside it):
    a job resumed on its own (train.py run_dir=<job>) is still one."""
    return (output_dir.parent / "multirun.yaml").is_file()


def in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def command_line_overrides() -> list[str]:
    """The overrides this run was launched with (empty outside a Hydra app)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
