"""Files written whole or not at all: a checkpoint, a report, a figure is written to a hidden
sibling (`.<name>.partial-<pid>`) and renamed onto its name only once complete, so that a
full disk or a kill leaves the earlier file (or none), never half of one. The file gets the
mode a plain open() gives (0666 less the umask), whatever mode its writer created the sibling
with (a temporary file's 0600 would survive the rename). A file system's
refusal is one sentence naming the file (attnlab.errors.refused_by_machine), also where
a log file is written (`refusals_stop_logging`)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnlab.errors import refused_by_machine


def durable_replace(source: Path, target: Path) -> None:
    """Rename `source` over `target`, the rename itself synced (it survives a crash)."""
    os.replace(source, target)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def plain_mode() -> int:
    """The mode open() gives a new file: 0666 less the process's umask, read from
    /proc/self/status where Linux shows it (setting the umask to read it, the fallback, would
    change it for an instant under the process's other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def give_plain_mode(path: Path) -> None:
    """Set `path` to plain_mode() where its writer created it with another (a file system
    that keeps no modes, such as FAT, refuses the change: it is left as that one gives)."""
    mode = plain_mode()
    if stat.S_IMODE(path.stat().st_mode) != mode:
        with contextlib.suppress(PermissionError):
            os.chmod(path, mode)


def partial_of(path: Path) -> Path:
    """Where this process writes `path` before it is whole."""
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


@contextmanager
def written(path: Path, durable: bool = False) -> Iterator[Path]:
    """The sibling of `path` to write in the block: renamed onto `path` when the block ends
    (`durable`: the rename synced) with the mode of a plain open(), removed when it fails; a
    full disk or a read-only place is a MachineError naming `path`."""
    partial = partial_of(path)
    try:
        yield partial
        give_plain_mode(partial)
        (durable_replace if durable else os.replace)(partial, path)
    except Exception as error:
        refusal = refused_by_machine(error, path)
        if refusal is None:
            raise
        raise refusal from None
    finally:
        partial.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """`path` holding `text` (UTF-8), whole or not at all."""
    with written(path) as partial:
        partial.write_text(text, encoding="utf-8")


def refusals_stop_logging(logger: logging.Logger) -> None:
    """Make the file handlers of `logger` raise the MachineError of a write the machine
    refuses (a full disk) from the call that logged, where logging would print a traceback
    for that record, and for every record after it, and go on."""
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = functools.partial(_refused_or_reported, handler)  # type: ignore[method-assign]


def _refused_or_reported(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    error = sys.exc_info()[1]
    refusal = None if error is None else refused_by_machine(error, Path(handler.baseFilename))
    if refusal is None:
        logging.FileHandler.handleError(handler, record)
        return
    raise refusal
