"""status.json: how a run ended, written by train.py and read by `attnlab compare`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from attnlab import status


def test_a_run_is_running_then_completed_with_its_progress(tmp_path):
    with status.tracking(tmp_path) as tracker:
        assert status.read(tmp_path).state == "running"
        tracker.update(params=10, steps=3)
    recorded = status.read(tmp_path)
    assert (recorded.state, recorded.params, recorded.steps) == ("completed", 10, 3)
    assert recorded.ended >= recorded.started and recorded.error is None


@pytest.mark.parametrize(
    "error,state,line",
    [
        (ValueError("bad value\nsecond line"), "failed", "ValueError: bad value\nsecond line"),
        (KeyboardInterrupt(), "interrupted", "KeyboardInterrupt"),
    ],
)
def test_a_run_that_raises_records_how_it_ended_and_the_error(error, state, line, tmp_path):
    with pytest.raises(type(error)), status.tracking(tmp_path):
        raise error
    recorded = status.read(tmp_path)
    assert recorded.state == state and recorded.error == line
    assert "Traceback" in recorded.traceback and type(error).__name__ in recorded.traceback


def test_only_the_writing_process_writes(tmp_path):
    with status.tracking(tmp_path, enabled=False):
        pass
    assert not (tmp_path / status.FILE).exists()


@pytest.mark.parametrize(
    "text", ["{", "[]", '{"state": "exploded", "started": 1}', '{"state": "running"}']
)
def test_a_file_in_another_format_reads_as_no_status(text, tmp_path):
    (tmp_path / status.FILE).write_text(text)
    assert status.read(tmp_path) is None


def test_a_running_run_whose_process_is_gone_is_not_alive(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = status.RunStatus("running", 0.0, pid=child.pid)
    assert not gone.alive()
    assert status.RunStatus("running", time.time()).alive(), "this process is alive"
    assert not status.RunStatus("running", 0.0).alive(), "a pid reused by a later process"
    elsewhere = status.RunStatus("running", 0.0, pid=child.pid, host="another-host")
    assert elsewhere.alive(), "a process on another host cannot be checked: assume it runs"
    gone.write(tmp_path)
    assert json.loads((tmp_path / status.FILE).read_text())["pid"] == child.pid


def test_a_killed_run_ends_when_it_last_wrote_and_its_resumption_counts_only_that(tmp_path):
    """A run killed without recording its end (SIGKILL, a lost machine) ran until it last
    wrote its metrics or a checkpoint, not until someone looked at it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    started = time.time() - 3600
    status.RunStatus("running", started, pid=child.pid).write(tmp_path)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step\n1\n")
    os.utime(tmp_path / "csv" / "metrics.csv", (started + 100, started + 100))
    assert status.read(tmp_path).wall_time == pytest.approx(100)
    with status.tracking(tmp_path, resumed=True) as tracker:
        assert tracker.status.earlier == pytest.approx(100)
