"""The errors that end a run with one sentence: what is wrong and how to fix it.

Entry points print such an error's message alone, without a traceback. Importing this module
has no side effect.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is wrong and how to fix it."""


class Diverged(ArithmeticError):
    """Training reached a NaN or infinite loss; the message says when and what to change."""


class MachineError(RuntimeError):
    """The machine refused what a run needs (disk space, a writable directory); the message
    says what to do."""


# the errors of a file system that says no, and what to do about each
REFUSED = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space there (the disk quota is used up)",
    errno.EROFS: "choose a writable place (paths.log_dir=<dir>)",
    errno.EACCES: "make it writable, or choose another place (paths.log_dir=<dir>)",
    errno.EPERM: "make it writable, or choose another place (paths.log_dir=<dir>)",
}


def refused_by_machine(error: BaseException, path: Path | None = None) -> MachineError | None:
    """The one-sentence MachineError for an error that a file system's refusal (disk full,
    read-only, no permission) caused, directly or underneath (torch.save reports a full disk
    as a RuntimeError whose context is the OSError), writing `path` (else the error's file);
    None for any other error."""
    seen: BaseException | None = error
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in REFUSED):
        if isinstance(seen, MachineError):
            return seen
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    target = path if path is not None else Path(seen.filename) if seen.filename else None
    if target is None:
        return MachineError(f"the machine refused a write ({seen.strerror}): {REFUSED[seen.errno]}")
    free = shutil.disk_usage(target.parent).free / 2**20 if target.parent.is_dir() else None
    room = f", {free:.1f} MiB free there" if free is not None else ""
    return MachineError(f"could not write {target} ({seen.strerror}{room}): {REFUSED[seen.errno]}")


ELSEWHERE = "make it writable, or pass paths.log_dir=<a writable directory>"


def unwritable(directory: Path, reason: str, fix: str = ELSEWHERE) -> str:
    return f"cannot write in {directory} ({reason}): {fix}"


def check_writable(directory: Path, fix: str = ELSEWHERE) -> None:
    """Make `directory` (a run's, named on the command line) or say why it cannot be made,
    and `fix`, what to do."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(unwritable(directory, error.strerror, fix)) from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(unwritable(directory, "permission denied", fix))
