"""A run directory has one writer, and a refused command changes nothing in it.

Real train.py processes: a second writer started while the first trains, a run killed by
SIGKILL and resumed, a new run or sweep pointed at a directory that holds runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from attnlab import status
from attnlab.runner import lock

QUIET = ["extras.print_config=false", "callbacks.progress_bar.refresh_rate=0"]
TRAINING = [
    "model=tiny", "task.data.train_size=2048", "test=false", "trainer.log_every_n_steps=1",
    "callbacks.latest.every_n_minutes=null", "callbacks.latest.every_n_steps=10", *QUIET,
]  # fmt: skip


def train_py(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def start(run_dir: Path, *args: str) -> subprocess.Popen:
    """A run training in `run_dir`, once it has written its first checkpoint."""
    process = subprocess.Popen(
        [sys.executable, "train.py", *TRAINING, *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.05)
    return process


def files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below `directory`: its bytes and its modification time."""
    return {
        str(path.relative_to(directory)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_second_writer_is_refused_while_the_first_trains_and_ctrl_c_ends_the_hold(tmp_path):
    run_dir = tmp_path / "run"
    first = start(run_dir, "trainer.max_epochs=100")
    try:
        config = files(run_dir / ".hydra")
        holder = f"process {first.pid} on {socket.gethostname()}"
        for second in ([f"run_dir={run_dir}"], [f"hydra.run.dir={run_dir}"]):
            refused = train_py(*second)
            assert refused.returncode == 1, refused.stderr[-3000:]
            assert last_line(refused) == (
                f"attnlab: {run_dir} is being written by the run of {holder}: wait for it to "
                f"end, or stop it (kill -TERM {first.pid}), then resume with run_dir={run_dir}"
            )
        assert files(run_dir / ".hydra") == config, "the refused commands wrote nothing"
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 1
    finally:
        first.kill()
    recorded = status.read(run_dir)
    assert (recorded.state, recorded.error) == ("interrupted", "interrupted by Ctrl-C or SIGTERM")
    assert not (run_dir / lock.FILE).exists(), "an interrupted run lets go of its directory"


@pytest.mark.slow
def test_the_lock_of_a_killed_run_is_named_and_taken_over_by_its_resumption(tmp_path):
    run_dir = tmp_path / "run"
    killed = start(run_dir, "trainer.max_epochs=100")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    assert json.loads((run_dir / lock.FILE).read_text())["pid"] == killed.pid
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]

    resumed = train_py(f"run_dir={run_dir}", f"trainer.max_steps={step + 2}", *QUIET)

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    taking_over = f"taking over the lock of process {killed.pid} on {socket.gethostname()}"
    assert taking_over in (run_dir / "train.log").read_text()
    assert status.read(run_dir).state == "completed" and not (run_dir / lock.FILE).exists()


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory) -> Path:
    """A sweep directory whose job 0 is a finished run (checkpoints, metrics, status)."""
    sweep = tmp_path_factory.mktemp("sweep")
    done = train_py(*TRAINING, "trainer.max_steps=12", f"hydra.run.dir={sweep / '0'}")
    assert done.returncode == 0, done.stderr[-3000:]
    return sweep


@pytest.mark.slow
def test_a_new_run_in_a_directory_that_holds_a_run_changes_nothing(finished_sweep):
    run_dir = finished_sweep / "0"
    before = files(finished_sweep)
    recorded = {".hydra/config.yaml", "train.log", "csv/metrics.csv", "status.json"}
    assert {f"0/{name}" for name in (*recorded, "checkpoints/last.ckpt")} <= set(before)

    refused = train_py("model=tiny", f"hydra.run.dir={run_dir}")

    assert refused.returncode == 1
    assert last_line(refused) == (
        f"attnlab: {run_dir} already holds a run: resume it with run_dir={run_dir}, or start "
        "this one in a new directory (leave hydra.run.dir to its default)"
    )
    assert files(finished_sweep) == before


@pytest.mark.slow
def test_a_sweep_into_a_directory_whose_jobs_hold_runs_changes_nothing(finished_sweep):
    before = files(finished_sweep)

    refused = train_py(
        "-m", "seed=1,2", "model=tiny", "trainer.max_steps=2", f"hydra.sweep.dir={finished_sweep}"
    )

    assert refused.returncode == 1
    assert last_line(refused) == (
        f"attnlab: {finished_sweep} already holds runs ({finished_sweep / '0'}): start this "
        "sweep in a new directory (leave hydra.sweep.dir to its default), or resume one of its "
        "runs with run_dir=<its directory>"
    )
    assert files(finished_sweep) == before
    assert sorted(p.name for p in finished_sweep.iterdir()) == ["0"]


def contained_refusal(entry: Path, target: Path, run_dir: Path, more: int) -> str:
    others = f" (and {more} more links)" if more else ""
    return (
        f"attnlab: {entry} is a link out of the run directory, to {target}{others}: a run writes "
        f"only inside its own directory, {run_dir}, and writing through a link would change the "
        "files it leads to; replace each link with a copy (cp -r, not cp -rs or cp -l), or start "
        "a new run"
    )


@pytest.mark.slow
def test_a_run_whose_metrics_folder_links_into_another_run_is_refused(finished_sweep, tmp_path):
    other = finished_sweep / "0"
    run_dir = tmp_path / "run"
    shutil.copytree(other, run_dir)
    shutil.rmtree(run_dir / "csv")
    os.symlink(other / "csv", run_dir / "csv")
    before, own = files(finished_sweep), files(run_dir)

    refused = train_py(f"run_dir={run_dir}", "trainer.max_steps=16", *QUIET)

    assert refused.returncode == 1, refused.stderr[-3000:]
    assert last_line(refused) == contained_refusal(run_dir / "csv", other / "csv", run_dir, 0)
    assert files(finished_sweep) == before, "the other run's metrics and hparams are untouched"
    assert files(run_dir) == own


@pytest.mark.slow
def test_a_fork_of_links_is_refused_and_a_fork_of_copies_resumes_on_its_own(
    finished_sweep, tmp_path
):
    other = finished_sweep / "0"
    fork = tmp_path / "fork"
    subprocess.run(["cp", "-rs", str(other), str(fork)], check=True)
    links = sorted(path for path in fork.rglob("*") if path.is_symlink())
    first = min(path for path in links if path.parent == fork)
    refusal = contained_refusal(first, other / first.name, fork, len(links) - 1)
    before = files(finished_sweep)

    for resume in (f"run_dir={fork}", f"ckpt_path={fork / 'checkpoints' / 'last.ckpt'}"):
        refused = train_py(resume, "trainer.max_steps=16", *QUIET)
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert last_line(refused) == refusal
    assert files(finished_sweep) == before

    copied = tmp_path / "copied"
    shutil.copytree(other, copied)
    resumed = train_py(f"run_dir={copied}", "trainer.max_steps=14", *QUIET)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.splitlines()[-1].split() == ["run", "dir", str(copied)]
    assert status.read(copied).state == "completed"
    assert files(finished_sweep) == before


@pytest.mark.slow
def test_an_evaluation_into_the_directory_of_the_run_it_evaluates_changes_nothing(
    finished_sweep,
):
    run_dir = finished_sweep / "0"
    before = files(finished_sweep)

    refused = subprocess.run(
        [sys.executable, "eval.py", f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
         f"hydra.run.dir={run_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert refused.returncode == 1
    assert last_line(refused) == (
        f"attnlab: hydra.run.dir={run_dir} holds a training run, whose record and metrics "
        "eval.py would write over: leave hydra.run.dir to its default "
        "(logs/<task>/evals/<time>), or pass a new directory"
    )
    assert files(finished_sweep) == before
