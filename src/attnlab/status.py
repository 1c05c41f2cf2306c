"""A run's state on disk, `<run dir>/status.json`: running, completed, failed or interrupted.

`train.py` writes it when a run starts, once its model is built, and when it ends (with the
last line of the error and the traceback when it fails, or why it was interrupted), holding
the directory's lock meanwhile (`attnlab.runner.status.tracking`); `attnlab compare`, `attnlab
prune` and the runner read it here, to tell finished, failed and unfinished jobs apart.
Plain JSON: reading it runs nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnlab.processes import running

FILE = "status.json"
STATES = ("running", "completed", "failed", "interrupted")


@dataclass
class RunStatus:
    state: str
    started: float  # seconds since the epoch
    ended: float | None = None
    earlier: float = 0.0  # seconds run before the latest resume
    steps: int | None = None  # optimizer steps taken
    params: int | None = None  # trainable parameters
    device: str | None = None  # what trained it: a GPU's name, or the CPU's and its threads
    error: str | None = None  # the error's last line ("ValueError: ..."), or INTERRUPTED
    traceback: str | None = None
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)

    @property
    def wall_time(self) -> float:
        return self.earlier + (self.ended or time.time()) - self.started

    def alive(self) -> bool:
        """Whether a run in state "running" still is: false when its process on this host is
        gone (killed without a chance to record it), or when its pid now belongs to a process
        that started after the run did; true when it runs on another host."""
        return running(self.host, self.pid, self.started)

    def write(self, run_dir: Path) -> None:
        """Replace the file in one step, so that a reader never sees half of it."""
        run_dir.mkdir(parents=True, exist_ok=True)
        partial = run_dir / f".{FILE}.{self.pid}"
        try:
            partial.write_text(json.dumps(asdict(self), indent=1))
            partial.replace(run_dir / FILE)
        finally:
            partial.unlink(missing_ok=True)

    def end(self, state: str, error: BaseException | None = None) -> None:
        self.state, self.ended = state, time.time()
        if error is not None:
            self.error = traceback.format_exception_only(error)[-1].strip()
            self.traceback = "".join(traceback.format_exception(error))


NUMBER, NONE = (int, float), type(None)
FORM = {  # RunStatus's fields and the JSON types each is read from (a bool is not a number)
    "state": (str,),
    "started": NUMBER,
    "ended": (*NUMBER, NONE),
    "earlier": NUMBER,
    "steps": (int, NONE),
    "params": (int, NONE),
    "device": (str, NONE),
    "error": (str, NONE),
    "traceback": (str, NONE),
    "pid": (int,),
    "host": (str,),
}


def holds_run(directory: Path) -> bool:
    """Whether train.py wrote a run into `directory`: its status, or Hydra's record of it."""
    return (directory / FILE).is_file() or (directory / ".hydra").is_dir()


def last_written(run_dir: Path, default: float) -> float:
    """When training last wrote to `run_dir` (metrics, checkpoints): the end of a run killed
    without recording it, to within one flush of its metrics."""
    files = [f for name in ("csv", "checkpoints") for f in (run_dir / name).glob("*")]
    return max((f.stat().st_mtime for f in files if f.is_file()), default=default)


def read(run_dir: Path) -> RunStatus | None:
    """The status a run recorded; None where it recorded none (or not in this format). A run
    whose process died without recording its end gets the time it last wrote as its end."""
    data = load(run_dir)
    if not isinstance(data, dict) or flaw(data):
        return None
    found = RunStatus(**{k: v for k, v in data.items() if k in FORM})
    if found.ended is None and not found.alive():
        found.ended = last_written(run_dir, default=found.started)
    return found


def load(run_dir: Path) -> object:
    """The data of a run's status file; None where it has none or it is not JSON."""
    try:
        return json.loads((run_dir / FILE).read_text())
    except (OSError, ValueError):
        return None


def flaw(data: object) -> str:
    """What makes `data` something other than a run's status, in words ("" if nothing)."""
    if not isinstance(data, dict):
        return "is not a JSON object"
    if data.get("state") not in STATES:
        return f"records the state {data.get('state')!r}, not one of {', '.join(STATES)}"
    if "started" not in data:
        return "records no start"
    wrong = [k for k, kinds in FORM.items() if k in data and type(data[k]) not in kinds]
    return (
        f"records {wrong[0]}={data[wrong[0]]!r}, not of type {FORM[wrong[0]][0].__name__}"
        if wrong
        else ""
    )


def damage(run_dir: Path) -> str:
    """A sentence naming what is wrong with the run's status file ("" when it has none, or a
    good one)."""
    if not (run_dir / FILE).is_file():
        return ""
    data = load(run_dir)
    why = "cannot be read as JSON" if data is None else flaw(data)
    return f"{run_dir / FILE} {why}" if why else ""
