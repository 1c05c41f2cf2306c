"""Where a logger writes, checked when it is built rather than at its first write (a
traceback mid-run) or after MLflow's two minutes of retries: a directory it can make and
write in, a SQLite database it can open for writing. Otherwise one sentence that names the
setting."""

from __future__ import annotations

import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

from attnlab.errors import ConfigError

LOCK_WAIT = 60  # seconds to wait for another run's write to the same database


def unwritable(setting: str, place: Path, reason: object, wanted: str) -> ConfigError:
    return ConfigError(f"{setting}={place} cannot be written ({reason}): pass {wanted}")


def why_not_writable(directory: Path) -> str:
    """Why a file cannot be written in `directory` (made if missing); "" when it can: a file
    was created and removed in it (a permission test alone passes as root)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:  # named: the part of the path that failed, not the test file
        failed = Path(error.filename or directory)
        return f"{error.strerror}: {directory if failed.parent == directory else failed}"
    return ""


def writable_directory(directory: str | Path, setting: str) -> Path:
    place = Path(directory)
    if why := why_not_writable(place):
        raise unwritable(setting, place, why, "a directory you can write")
    return place


def writable_database(path: str | Path, setting: str) -> Path:
    """`path`, a SQLite database (created empty if missing) that this process holds a write
    lock on for a moment: a file of another kind, or a place it cannot write, is refused."""
    place = Path(path).resolve()
    if why := why_not_writable(place.parent):
        raise unwritable(setting, place, why, "a SQLite file in a directory you can write")
    try:
        with closing(sqlite3.connect(place, timeout=LOCK_WAIT, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")  # a write lock: reads the header, needs write access
            db.execute("ROLLBACK")
    except sqlite3.Error as error:
        raise unwritable(setting, place, error, "a SQLite file you can write") from None
    return place
