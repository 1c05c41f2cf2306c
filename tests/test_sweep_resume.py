"""A -m sweep that stopped part-way is finished by `train.py run_dir=<sweep dir>`: its
finished jobs are left untouched, an interrupted one resumes, the ones never started run
with the overrides the sweep gave them, in its numbering."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from omegaconf import OmegaConf
from test_run_ownership import train_py

from attnlab import status
from attnlab.runner.sweep_resume import JOBLIB, job_command, parallel_jobs, run_all, sweep_jobs

TINY = [
    "model=tiny", "task.data.train_size=64", "task.data.max_len=8", "extras.print_config=false",
    "callbacks.progress_bar.refresh_rate=0",
]  # fmt: skip


def overrides(job_dir: Path) -> list[str]:
    return OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml"))


# a setting whose value is a list of records, as a hybrid stack's layers are given
PATTERN = ["pe=rope", "schedule=nope_every_4", "model.schedule.pattern=[{pe:pe},{pe:nope}]"]


@pytest.fixture(scope="module")
def killed_sweep(tmp_path_factory) -> Path:
    """A 3-job sweep of a hybrid stack SIGKILLed while its job 1 trains (its last.ckpt written
    at the end of an epoch, each of one step): job 0 done, job 2 never started."""
    sweep = tmp_path_factory.mktemp("killed") / "sweep"
    process = subprocess.Popen(
        [sys.executable, "train.py", "-m", *TINY, *PATTERN, "trainer.max_epochs=2,60,3",
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    last = sweep / "1" / "checkpoints" / "last.ckpt"
    deadline = time.time() + 240
    while not last.is_file() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL, "killed before job 1 checkpointed"
    assert not (sweep / "2").exists()
    return sweep


def test_the_jobs_listed_again_are_the_ones_hydra_ran(killed_sweep):
    jobs = sweep_jobs(killed_sweep)
    assert len(jobs) == 3
    assert [overrides(killed_sweep / str(n)) for n in (0, 1)] == jobs[:2]
    assert jobs[2][-1] == "trainer.max_epochs=3" and jobs[2][:-1] == jobs[0][:-1]


def test_a_killed_sweep_finishes_and_leaves_its_finished_job_alone(killed_sweep, tmp_path):
    done = killed_sweep / "0"
    before = {path: path.read_bytes() for path in done.rglob("*") if path.is_file()}
    assert status.read(done).state == "completed"
    result = train_py(f"run_dir={killed_sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "attnlab: " + f"{killed_sweep}: 2 of 3 jobs to run or resume" in result.stdout
    assert {path: path.read_bytes() for path in done.rglob("*") if path.is_file()} == before
    for n, epochs in ((1, 60), (2, 3)):
        record = status.read(killed_sweep / str(n))
        assert record.state == "completed" and record.steps == epochs
    assert record.earlier == 0.0, "job 2 ran afresh"
    assert status.read(killed_sweep / "1").earlier > 0, "job 1 resumed, not restarted"
    assert overrides(killed_sweep / "2") == sweep_jobs(killed_sweep)[2]
    for n in (1, 2):  # the hybrid stack each job was asked for, resumed or started afresh
        ran = OmegaConf.load(killed_sweep / str(n) / ".hydra" / "config.yaml")
        assert OmegaConf.to_container(ran.model.schedule.pattern) == [{"pe": "pe"}, {"pe": "nope"}]
    assert "comparison: " in result.stdout and (killed_sweep / "comparison.md").is_file()
    again = train_py(f"run_dir={killed_sweep}")
    assert again.returncode == 0 and "0 of 3 jobs to run or resume" in again.stdout


def fake_sweep(directory: Path, sweeper: str, task: list[str]) -> Path:
    directory.mkdir()
    record = {"hydra": {"sweeper": {"_target_": sweeper, "params": {"pe": "none,rope"}},
                        "overrides": {"task": task}, "launcher": {},
                        "sweep": {"subdir": "${hydra.job.num}"}}}  # fmt: skip
    OmegaConf.save(record, directory / "multirun.yaml")
    return directory


BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def test_jobs_are_the_params_then_the_command_line_in_hydras_order(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny", "seed=1,2", "hydra.verbose=true"])
    assert sweep_jobs(sweep) == [
        ["pe=none", "model=tiny", "seed=1"], ["pe=none", "model=tiny", "seed=2"],
        ["pe=rope", "model=tiny", "seed=1"], ["pe=rope", "model=tiny", "seed=2"],
    ]  # fmt: skip


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_a_sweep_whose_trials_cannot_be_listed_again_is_one_sentence(tmp_path):
    optuna = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    sweep = fake_sweep(tmp_path / "s", optuna, ["model=tiny"])
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        f"attnlab: {sweep} was swept by {optuna}, whose trials cannot be listed again: resume "
        "its jobs one by one with run_dir=<job dir>"
    )


def test_a_job_directory_that_ran_something_else_is_one_sentence(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny"])
    (sweep / "1" / ".hydra").mkdir(parents=True)
    OmegaConf.save(["pe=alibi", "model=tiny"], sweep / "1" / ".hydra" / "overrides.yaml")
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        f"attnlab: {sweep / '1'} did not run the job pe=rope model=tiny that "
        f"{sweep / 'multirun.yaml'} lists as job 1: move it out of {sweep}, then resume again"
    )


def test_a_job_stopped_before_its_first_checkpoint_is_named_and_left(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, [*TINY, "trainer.max_epochs=1"])
    job = sweep / "0"
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(sweep_jobs(sweep)[0], job / ".hydra" / "overrides.yaml")
    (job / "train.log").write_text("what it logged before it stopped\n")
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1, "a job left undone fails the sweep"
    assert (
        f"attnlab: job 0 ({job}) holds no run: left as it is; delete it and resume again to "
        "run it afresh"
    ) in result.stderr
    assert (job / "train.log").read_text() == "what it logged before it stopped\n"
    assert status.read(sweep / "1").state == "completed"


def test_finishing_a_sweep_with_a_flag_is_one_sentence(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny"])
    result = train_py("-m", f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        "attnlab: run_dir= of a sweep finishes it as it was launched, so it takes no flags "
        "(-m): pass settings only"
    )


def test_a_sweep_still_running_is_refused(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny"])
    (sweep / "0").mkdir()
    status.RunStatus(state="running", started=time.time()).write(sweep / "0")  # this process
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        f"attnlab: {sweep} is still running: job 0 trains (pid {os.getpid()} on "
        f"{socket.gethostname()}); finish the sweep once it has stopped"
    )
    assert not (sweep / "1").exists()


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [({"_target_": JOBLIB, "n_jobs": 2}, 2), ({"_target_": JOBLIB, "n_jobs": "${x}"}, 1), ({}, 1)],
)
def test_jobs_run_as_many_at_a_time_as_the_sweeps_joblib_ran(tmp_path, launcher, expected):
    sweep = fake_sweep(tmp_path / "s", BASIC, [])
    record = OmegaConf.load(sweep / "multirun.yaml")
    record.hydra.launcher = launcher
    OmegaConf.save(record, sweep / "multirun.yaml")
    assert parallel_jobs(sweep) == expected


def child(mark: Path) -> list[str]:
    """A job that records its threads and lifetime, and saves 'int' on SIGINT."""
    code = (
        "import os, signal, sys, time; mark = sys.argv[1]\n"
        "signal.signal(signal.SIGINT, lambda *_: (open(mark + '.int', 'w').close(), sys.exit(3)))\n"
        "open(mark, 'w').write(f\"{os.environ.get('OMP_NUM_THREADS')} {time.time()}\")\n"
        "time.sleep(float(sys.argv[2])); open(mark + '.end', 'w').write(str(time.time()))\n"
    )
    return [sys.executable, "-c", code, str(mark)]


def test_two_at_a_time_each_on_its_share_of_the_cores(tmp_path):
    assert run_all([[*child(tmp_path / str(n)), "0.5"] for n in range(3)], 2) is None
    started = {n: float((tmp_path / str(n)).read_text().split()[1]) for n in range(3)}
    ended = {n: float((tmp_path / f"{n}.end").read_text()) for n in range(3)}
    assert started[2] >= min(ended[0], ended[1]), "the third waited for a place"
    threads = {(tmp_path / str(n)).read_text().split()[0] for n in range(3)}
    assert threads == {str(max(1, (os.cpu_count() or 1) // 2))}


def test_ctrl_c_reaches_each_running_job_and_starts_no_other(tmp_path):
    jobs = [[*child(tmp_path / str(n)), "60"] for n in range(3)]
    script = (
        "import sys; from attnlab.runner.sweep_resume import run_all\n"
        f"sys.exit(128 + run_all({jobs!r}, 2))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not all((tmp_path / str(n)).is_file() for n in (0, 1)) and time.time() < deadline:
        time.sleep(0.05)
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=60) == 128 + signal.SIGINT
    assert [(tmp_path / f"{n}.int").is_file() for n in range(3)] == [True, True, False]
    assert not (tmp_path / "2").exists()


def test_a_job_never_started_reads_its_data_from_where_the_sweep_was_launched(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["task.data.dir=corpus"])
    launched_here = str(tmp_path / "launched_here")
    command = job_command(sweep, 1, sweep_jobs(sweep)[1], None, [], launched_here)
    assert f"task.data.dir='{tmp_path / 'launched_here' / 'corpus'}'" in command
    assert command[-1] == f"hydra.run.dir={sweep / '1'}"


def test_a_job_never_started_whose_override_a_file_may_not_set_is_refused(tmp_path):
    """Started without it, the job would run another configuration than the sweep's."""
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny", "callbacks.latest=null"])
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        f"attnlab: job 0 of {sweep} has overrides that are not applied again from a file "
        "(callbacks.latest=null), so it would run another configuration: pass them after "
        "run_dir=, or run the job yourself (python train.py pe=none model=tiny "
        f"callbacks.latest=null hydra.run.dir={sweep / '0'}), then resume again"
    )
    assert not (sweep / "0").exists()
    given = job_command(sweep, 0, sweep_jobs(sweep)[0], None, ["callbacks.latest=null"])
    assert given[-2:] == ["callbacks.latest=null", f"hydra.run.dir={sweep / '0'}"]


def test_a_sweep_whose_jobs_are_not_numbered_is_one_sentence(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny"])
    record = OmegaConf.load(sweep / "multirun.yaml")
    record.hydra.sweep.subdir = "${hydra.job.override_dirname}"
    OmegaConf.save(record, sweep / "multirun.yaml")
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        f"attnlab: {sweep} names its job directories ${{hydra.job.override_dirname}}, not by job "
        "number: resume its jobs one by one with run_dir=<job dir>"
    )
    assert not (sweep / "0").exists()


def test_a_job_directory_with_a_damaged_record_is_one_sentence(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny"])
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- [unclosed\n")
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result).startswith(f"attnlab: {sweep / '0'} did not run the job pe=none")


def test_a_job_with_a_damaged_status_is_one_sentence_and_no_job_runs(tmp_path):
    sweep = fake_sweep(tmp_path / "s", BASIC, ["model=tiny"])
    (sweep / "1").mkdir()
    (sweep / "1" / "status.json").write_text('{"state": "completed", "started": 1, "steps": [3]}')
    result = train_py(f"run_dir={sweep}")
    assert result.returncode == 1
    assert last_line(result) == (
        f"attnlab: {sweep / '1' / 'status.json'} records steps=[3], not of type int: restore "
        "it, or delete its job's directory to run the job afresh, then resume again"
    )
    assert not (sweep / "0").exists()


def test_an_interrupted_sweep_job_names_the_command_that_finishes_the_sweep(tmp_path):
    from helpers import compose_config

    from attnlab.runner.train import interrupted

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    cfg = compose_config(["model=tiny"], sweep / "0")
    assert interrupted(cfg) == (
        f"attnlab: interrupted; finish the sweep with: python train.py run_dir={sweep.resolve()}"
    )
