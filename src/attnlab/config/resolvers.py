"""The resolvers the configs use: `${cwd:}`, `${unique:path}`, which creates run and sweep
directories (one per run, never shared), and `${by_steps:trainer,a,b}`, which picks the best
checkpoint's name by how the run validates."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.errors import unwritable

_reserved: list[Path] = []  # directories unique_directory made in this process


def unique_directory(path: str) -> str:
    """`path`, else `path_2`, `path_3`, ...: the first that did not exist, created by this call
    (mkdir is exclusive: runs started in the same second, by any launcher, never share one).

    Hydra also resolves a run directory that a later config replaces (debug=..., eval.py)
    while it merges configs; what that made stays empty and is removed when the process ends.
    """
    base = Path(path)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            candidate = base if n == 1 else base.with_name(f"{base.name}_{n}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            _reserved.append(candidate)
            return str(candidate)
    except OSError as error:
        # an exit, not an error: OmegaConf turns a resolver's errors into 100-line reports
        raise SystemExit(f"attnlab: {unwritable(base.parent, error.strerror)}") from None
    raise AssertionError("unreachable")


def validates_by_steps(trainer: DictConfig) -> bool:
    """Whether a run of `trainer` counts its budget and its validations in steps: a
    max_steps budget, validated every val_check_interval batches (an int) or across epochs
    (check_val_every_n_epoch null)."""
    by_batches = isinstance(trainer.get("val_check_interval"), int)
    across_epochs = trainer.get("check_val_every_n_epoch") is None
    return (trainer.get("max_steps") or -1) > 0 and (by_batches or across_epochs)


def by_steps(trainer: DictConfig, steps: str, epochs: str) -> str:
    """`steps` for a run of `trainer` that validates by steps, else `epochs`."""
    return steps if validates_by_steps(trainer) else epochs


def _release_unused() -> None:
    for directory in _reserved:
        with contextlib.suppress(OSError):  # not empty: a run used it
            directory.rmdir()


def register_resolvers() -> None:
    """The resolvers the configs use; called by every entry point before Hydra composes.

    `${cwd:}`, the directory a run is launched from, for paths.root_dir (Hydra's own
    `${hydra:runtime.cwd}` is unset when a multirun's sweeper resolves hydra.sweep.dir).
    `${unique:path}` for run and sweep directories, cached, so that every later read of
    hydra.run.dir (and every job's copy of a sweep's config) gives the one directory made.
    `${by_steps:${trainer},<name>,<name>}` for the best checkpoint's filename, by step in a
    run that validates by steps, by epoch otherwise (conf/callbacks/default.yaml).
    """
    if not OmegaConf.has_resolver("unique"):
        atexit.register(_release_unused)
    OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
    OmegaConf.register_new_resolver("unique", unique_directory, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("by_steps", by_steps, replace=True)
