"""status.json: how a run ended, written by train.py and read by `attnlab compare`."""

from __future__ import annotations

import json
import subprocess
import sys

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
    assert status.RunStatus("running", 0.0).alive(), "this process is alive"
    elsewhere = status.RunStatus("running", 0.0, pid=child.pid, host="another-host")
    assert elsewhere.alive(), "a process on another host cannot be checked: assume it runs"
    gone.write(tmp_path)
    assert json.loads((tmp_path / status.FILE).read_text())["pid"] == child.pid
