"""status.json: how a run ended, written by train.py and read by `attnlab compare`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from attnlab import status
from attnlab.errors import ConfigError
from attnlab.runner import lock
from attnlab.runner.status import tracking


def test_a_run_is_running_then_completed_with_its_progress(tmp_path):
    with tracking(tmp_path) as tracker:
        assert status.read(tmp_path).state == "running"
        tracker.update(params=10, steps=3)
    recorded = status.read(tmp_path)
    assert (recorded.state, recorded.params, recorded.steps) == ("completed", 10, 3)
    assert recorded.ended >= recorded.started and recorded.error is None


def test_a_run_that_fails_records_the_error_and_its_traceback(tmp_path):
    with pytest.raises(ValueError), tracking(tmp_path):
        raise ValueError("bad value\nsecond line")
    recorded = status.read(tmp_path)
    assert recorded.state == "failed" and recorded.error == "ValueError: bad value\nsecond line"
    assert "Traceback" in recorded.traceback and "ValueError" in recorded.traceback


@pytest.mark.parametrize(
    "stop", [KeyboardInterrupt(), SystemExit(0)], ids=["KeyboardInterrupt", "SystemExit"]
)
def test_an_interrupted_run_says_so_not_which_exception_carried_the_stop(stop, tmp_path):
    """Lightning stops on Ctrl-C and SIGTERM by raising SIGTERMException, a SystemExit."""
    with pytest.raises(type(stop)), tracking(tmp_path):
        raise stop
    recorded = status.read(tmp_path)
    assert (recorded.state, recorded.error) == ("interrupted", "interrupted by Ctrl-C or SIGTERM")
    assert recorded.traceback is None


def test_only_the_writing_process_writes(tmp_path):
    with tracking(tmp_path, enabled=False):
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
    with tracking(tmp_path, resumed=True) as tracker:
        assert tracker.status.earlier == pytest.approx(100)


# --- run.lock: one writer per run directory (real processes: test_run_ownership.py) ---------


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_lock(run_dir, pid: int, host: str, started: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / lock.FILE).write_text(json.dumps({"pid": pid, "host": host, "started": started}))


def test_a_run_holds_its_directory_until_it_ends_and_a_second_writer_changes_nothing(tmp_path):
    with tracking(tmp_path) as tracker:
        held = json.loads((tmp_path / lock.FILE).read_text())
        assert (held["pid"], held["host"]) == (os.getpid(), socket.gethostname())
        tracker.update(steps=3)
        before = (tmp_path / status.FILE).read_bytes()
        with pytest.raises(ConfigError) as refused, tracking(tmp_path, resumed=True):
            pass
        assert (tmp_path / status.FILE).read_bytes() == before
        assert (tmp_path / lock.FILE).is_file(), "the refused writer leaves the lock alone"
    assert str(refused.value) == (
        f"{tmp_path} is being written by the run of process {os.getpid()} on "
        f"{socket.gethostname()}: wait for it to end, or stop it (kill -TERM {os.getpid()}), "
        f"then resume with run_dir={tmp_path}"
    )
    assert not (tmp_path / lock.FILE).exists() and status.read(tmp_path).state == "completed"


def test_only_the_writing_process_of_a_distributed_run_takes_the_lock(tmp_path):
    write_lock(tmp_path, os.getpid(), socket.gethostname(), time.time())
    with tracking(tmp_path, enabled=False):
        pass
    assert (tmp_path / lock.FILE).is_file()


@pytest.mark.parametrize(
    "pid,started", [(gone_pid(), 0.0), (os.getpid(), 0.0)], ids=["gone", "pid-reused"]
)
def test_a_stale_lock_is_named_and_taken_over(pid, started, tmp_path, caplog):
    write_lock(tmp_path, pid, socket.gethostname(), started)
    with caplog.at_level(logging.WARNING), tracking(tmp_path):
        assert json.loads((tmp_path / lock.FILE).read_text())["started"] > started
    assert f"taking over the lock of process {pid} on {socket.gethostname()}" in caplog.text
    assert not (tmp_path / lock.FILE).exists()


def test_a_lock_held_on_another_host_is_refused_and_says_how_to_clear_it(tmp_path):
    write_lock(tmp_path, gone_pid(), "another-host", 0.0)
    gone = f"if that process is gone, delete {tmp_path / lock.FILE}"
    with pytest.raises(ConfigError, match=re.escape(gone)):
        lock.check_free(tmp_path)


def test_a_lock_file_that_is_not_a_lock_is_one_sentence(tmp_path):
    (tmp_path / lock.FILE).write_text("{")
    not_a_lock = r"run\.lock is not a lock that train\.py wrote"
    with pytest.raises(ConfigError, match=not_a_lock), tracking(tmp_path):
        pass
    assert not (tmp_path / status.FILE).exists()


def test_every_field_of_a_status_is_checked_when_read_back(tmp_path):
    assert set(status.FORM) == {f.name for f in dataclasses.fields(status.RunStatus)}
    written = status.RunStatus("failed", 1.5, ended=2.0, steps=3, params=4, error="E: x")
    written.write(tmp_path)
    assert status.read(tmp_path) == written and status.damage(tmp_path) == ""
    for name in status.FORM:  # a list is of no field's type
        (tmp_path / status.FILE).write_text(json.dumps(dataclasses.asdict(written) | {name: [1]}))
        assert status.read(tmp_path) is None
        assert status.damage(tmp_path).startswith(f"{tmp_path / status.FILE} records"), name
