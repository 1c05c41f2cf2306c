"""A run's status file kept current while `train.py` runs it (`attnlab.status`: the record
and its reading): written when the run starts, as it goes and however it ends, under the
directory's lock (`attnlab.runner.lock`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from attnlab.runner import lock
from attnlab.status import FILE, RunStatus, read

log = logging.getLogger(__name__)

# why an interrupted run ended: Lightning stops at the end of a step on either, the same way
INTERRUPTED = "interrupted by Ctrl-C or SIGTERM"


class Tracker:
    """Keeps a run's status file current (`enabled`: only one process of a distributed run
    writes it)."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self.status = RunStatus("running", time.time())

    def update(self, **changes: object) -> None:
        """Record `changes`. A status that cannot be written (a full disk) is a warning, not
        the end of the run, nor what its error says: the error that ended it is."""
        for key, value in changes.items():
            setattr(self.status, key, value)
        if not self.enabled:
            return
        try:
            self.status.write(self.run_dir)
        except OSError as error:
            log.warning("could not record the run's state in %s: %s", self.run_dir / FILE, error)


@contextmanager
def tracking(run_dir: Path, enabled: bool = True, resumed: bool = False) -> Iterator[Tracker]:
    """Record the run in `run_dir` from its start to its end, however it ends, holding the
    directory's lock meanwhile (a second writer is refused before anything is written). A
    resumed run adds the time its earlier parts ran to its wall time."""
    with lock.held(run_dir) if enabled else nullcontext():
        tracker = Tracker(run_dir, enabled)
        earlier = read(run_dir) if resumed else None
        if earlier is not None:
            tracker.status.earlier = earlier.wall_time
        tracker.update()
        try:
            yield tracker
        except (KeyboardInterrupt, SystemExit):  # Lightning's Ctrl-C and SIGTERM: exits
            tracker.status.end("interrupted")
            tracker.update(error=INTERRUPTED)
            raise
        except BaseException as error:
            tracker.status.end("failed", error)
            tracker.update()
            raise
        tracker.status.end("completed")
        tracker.update()
