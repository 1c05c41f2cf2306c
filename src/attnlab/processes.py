"""Whether a process still runs, by its pid on its host: what tells a live run, or a live
lock's holder, from one killed without a chance to record it (`attnlab.status`,
`attnlab.runner.lock`). A pid is reused by later processes, so a process is known by its pid
and when it started (Linux /proc/<pid>/stat, field 22, starttime; proc(5)).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def process_start(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch (Linux /proc); None where that
    cannot be read."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def running(host: str, pid: int, since: float) -> bool:
    """Whether process `pid` on `host`, known to run at time `since`, still runs: false when
    it is gone from this host, or when its pid now belongs to a process that started later;
    true when it is on another host (it cannot be checked from here)."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = process_start(pid)
    return started is None or started <= since + 1.0
