"""One writer per run directory: `<run dir>/run.lock` names the process that trains there.
That writer writes only inside it: a directory holding a link that leads out of it is
refused (`check_contained`) before anything is written.

`attnlab.runner.status.tracking` takes the lock when a run starts and removes it when the run ends,
however it ends. A second process is refused with one sentence naming the holder's host and
pid. A lock whose process is gone (killed, or its pid now another, later process) is stale:
it is named in a warning and taken over. A holder on another host cannot be checked: it is
taken to be alive. The lock is JSON: host, pid and when that process started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnlab.errors import ConfigError
from attnlab.processes import process_start, running

log = logging.getLogger(__name__)

FILE = "run.lock"


@dataclass(frozen=True)
class Holder:
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    started: float = field(default_factory=lambda: process_start(os.getpid()) or time.time())

    def alive(self) -> bool:
        return running(self.host, self.pid, self.started)

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}"


def read(path: Path) -> Holder | None:
    """The holder a lock file names; None where there is no such file."""
    try:
        data = json.loads(path.read_text())
        return Holder(int(data["pid"]), str(data["host"]), float(data["started"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise ConfigError(
            f"{path} is not a lock that train.py wrote ({type(error).__name__}): delete it if "
            "no run is writing its directory"
        ) from None


def refusal(run_dir: Path, held: Holder) -> str:
    if held.host == socket.gethostname():
        stop = f"wait for it to end, or stop it (kill -TERM {held.pid})"
    else:
        stop = f"wait for it to end, or, if that process is gone, delete {run_dir / FILE}"
    from attnlab.shell import command, override

    return (
        f"{run_dir} is being written by the run of {held.describe()}: {stop}, then resume "
        f"with {command(override('run_dir', run_dir))}"
    )


def check_free(run_dir: Path) -> None:
    """Refuse a run directory whose lock a live process holds (a stale lock passes)."""
    held = read(run_dir / FILE)
    if held is not None and held.alive():
        raise ConfigError(refusal(run_dir, held))


def leaving(run_dir: Path) -> list[tuple[Path, str]]:
    """The entries below `run_dir` through which a write would change a file outside it, and
    where each leads: a symbolic link out of it (`cp -rs` makes a fork of them), a file with
    other hard links (`cp -l`). Links to folders are listed, not entered."""
    root = run_dir.resolve()
    found = []
    for directory, folders, files in os.walk(root):
        for name in sorted((*folders, *files)):
            entry = Path(directory, name)
            if entry.is_symlink() and not entry.resolve().is_relative_to(root):
                found.append((entry, f"a link out of the run directory, to {entry.resolve()}"))
            elif not entry.is_symlink() and entry.is_file() and entry.stat().st_nlink > 1:
                found.append((entry, "a hard link (its file has other names)"))
    return found


def check_contained(run_dir: Path) -> None:
    """Refuse a run directory that a run's writes would leave through a link (`leaving`)."""
    if found := leaving(run_dir):
        (entry, where), more = found[0], len(found) - 1
        others = f" (and {more} more links)" if more else ""
        raise ConfigError(
            f"{entry} is {where}{others}: a run writes only inside its own directory, {run_dir}, "
            "and writing through a link would change the files it leads to; replace each link "
            "with a copy (cp -r, not cp -rs or cp -l), or start a new run"
        )


def create(path: Path, mine: Holder) -> bool:
    """Write the lock file whole, if none exists: a hard link is made whole, in one step, or
    not at all (where O_EXCL would leave a moment with an empty file), on NFS too."""
    partial = path.with_name(f".{path.name}.{mine.pid}")
    partial.write_text(json.dumps(asdict(mine)))
    try:
        os.link(partial, path)
        return True
    except FileExistsError:
        return False
    finally:
        partial.unlink()


def remove_stale(path: Path, stale: Holder) -> None:
    """Remove the lock file if it still is `stale`: it is moved aside and checked first, since
    another process may have taken the stale lock over since it was read (theirs goes back)."""
    moved = path.with_name(f".{path.name}.stale-{os.getpid()}")
    try:
        os.replace(path, moved)
    except FileNotFoundError:
        return  # another process removed it
    if read(moved) != stale:
        with contextlib.suppress(FileExistsError):  # a third process took it: theirs stands
            os.link(moved, path)
    moved.unlink()


def acquire(run_dir: Path) -> Holder:
    """Take `run_dir`'s lock for this process (see the module docstring)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path, mine = run_dir / FILE, Holder()
    while not create(path, mine):
        held = read(path)
        if held is None:
            continue  # removed since: try again
        if held.alive():
            raise ConfigError(refusal(run_dir, held))
        log.warning(
            "%s: taking over the lock of %s, which no longer runs", run_dir, held.describe()
        )
        remove_stale(path, held)
    return mine


def release(run_dir: Path, mine: Holder) -> None:
    """Remove the lock if it is still this process's (one no longer readable is not)."""
    with contextlib.suppress(ConfigError):
        if read(run_dir / FILE) == mine:
            (run_dir / FILE).unlink(missing_ok=True)


@contextmanager
def held(run_dir: Path) -> Iterator[None]:
    mine = acquire(run_dir)
    try:
        yield
    finally:
        release(run_dir, mine)
