"""The resolvers the configs use: `${cwd:}` and `${unique:path}`, which creates run and sweep
directories (one per run, never shared)."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
from pathlib import Path

from omegaconf import OmegaConf

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
    """
    if not OmegaConf.has_resolver("unique"):
        atexit.register(_release_unused)
    OmegaConf.register_new_resolver("cwd", os.getcwd, replace=True)
    OmegaConf.register_new_resolver("unique", unique_directory, replace=True, use_cache=True)
