"""Finishing a -m sweep that stopped part-way: `python train.py run_dir=<sweep dir>`.

The sweep's jobs are the ones Hydra's basic sweeper makes of what `<sweep dir>/multirun.yaml`
stores (the sweeper's params, then the command line's overrides), in its order and
numbering, `<sweep dir>/<job num>`. Each job, by what its directory holds:
- a completed run: left as it is (even with the `last.ckpt` it may keep);
- `checkpoints/last.ckpt`: resumed, as `train.py run_dir=<job dir>` would;
- nothing (the sweep stopped before the job started): run in `<sweep dir>/<job num>` with the
  job's overrides, relative data locations taken from the directory the sweep was launched
  from; when attnlab.runner.resume's allow-list leaves out one that the arguments after
  `run_dir=` do not give again, the job would run something else than the sweep asked, so the
  resume refuses and gives the command to run it;
- anything else (a failed run, or one stopped before its first checkpoint): named and left
  alone, with its logs; delete its directory and resume again to run it afresh.
The resume launches the jobs itself, so the sweep's Hydra settings (`hydra/launcher=joblib`,
...) are not passed on: jobs run n at a time, n the sweep's joblib `n_jobs` (else 1), each
on its share of the cores. Arguments after `run_dir=` go to every job. It ends as the sweep
does: the comparison of every job, and a non-zero exit if any did not complete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig, OmegaConf

from attnlab import status
from attnlab.errors import ConfigError
from attnlab.runner.command_line import flags, parse_all
from attnlab.runner.resume import LAST
from attnlab.shell import override, resume_command, train_command

RECORD = "multirun.yaml"  # Hydra writes it into every sweep directory
BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
JOB_NUMBER = "${hydra.job.num}"  # conf/hydra's sweep.subdir: the jobs' directories by number


def is_sweep(directory: Path) -> bool:
    return (directory / RECORD).is_file() and not (directory / "checkpoints" / LAST).is_file()


def _stored(sweep: Path) -> dict[str, Any]:
    """The sweep's hydra node as plain data, nothing in it resolved."""
    try:
        config = OmegaConf.load(sweep / RECORD)
    except Exception as error:
        raise ConfigError(f"{sweep / RECORD} cannot be read ({error})") from None
    hydra = config.get("hydra") if isinstance(config, DictConfig) else None
    if not isinstance(hydra, DictConfig):
        raise ConfigError(f"{sweep / RECORD} is not the record of a Hydra sweep: it has no hydra")
    return OmegaConf.to_container(hydra, resolve=False)  # type: ignore[return-value]


def _is_hydra(override: str) -> bool:
    return override.lstrip("+~").startswith("hydra")


def sweep_jobs(sweep: Path) -> list[list[str]]:
    """Each job's overrides, in the sweep's order, as the basic sweeper made them (less
    Hydra's own settings)."""
    hydra = _stored(sweep)
    sweeper = hydra.get("sweeper") or {}
    if sweeper.get("_target_") != BASIC:
        raise ConfigError(
            f"{sweep} was swept by {sweeper.get('_target_')}, whose trials cannot be listed "
            "again: resume its jobs one by one with run_dir=<job dir>"
        )
    subdir = (hydra.get("sweep") or {}).get("subdir")
    if subdir != JOB_NUMBER:
        raise ConfigError(
            f"{sweep} names its job directories {subdir}, not by job number: resume its jobs "
            "one by one with run_dir=<job dir>"
        )
    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    arguments = [*params, *((hydra.get("overrides") or {}).get("task") or [])]
    try:
        parsed = parse_all(arguments)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)
    except Exception as error:
        raise ConfigError(
            f"the overrides of {sweep / RECORD} cannot be swept again ({error}): resume its "
            "jobs one by one with run_dir=<job dir>"
        ) from None
    return [[override for override in job if not _is_hydra(override)] for job in jobs]


def parallel_jobs(sweep: Path) -> int:
    launcher = _stored(sweep).get("launcher") or {}
    n_jobs = launcher.get("n_jobs")
    if launcher.get("_target_") == JOBLIB and isinstance(n_jobs, int) and n_jobs >= 1:
        return n_jobs
    return 1


def job_command(
    sweep: Path,
    number: int,
    overrides: list[str],
    record: status.RunStatus | None,
    extra: list[str],
    launched_from: str | None = None,
) -> list[str]:
    """How job `number` (its run's status `record`) goes on: [] when it is complete or cannot
    go on by itself. `launched_from`: the directory the sweep ran in."""
    from attnlab.runner.resume import absolute_locations, allowed_overrides

    job_dir = sweep / str(number)
    train = [sys.executable, "-m", "attnlab.runner.train"]
    allowed = allowed_overrides(overrides, f"{sweep / RECORD}, job {number}")
    # relative data locations read from where the sweep was launched, as its jobs did
    located = absolute_locations(allowed, launched_from) if launched_from else allowed
    if not job_dir.exists():
        if left_out := [text for text in overrides if text not in allowed and text not in extra]:
            typed = train_command(*overrides, override("hydra.run.dir", job_dir))
            raise ConfigError(
                f"job {number} of {sweep} has overrides that are not applied again from a file "
                f"({' '.join(left_out)}), so it would run another configuration: pass them after "
                f"run_dir=, or run the job yourself ({typed}), then resume again"
            )
        return [*train, *located, *extra, override("hydra.run.dir", job_dir)]
    ran_file = job_dir / ".hydra" / "overrides.yaml"
    try:
        ran = OmegaConf.to_container(OmegaConf.load(ran_file)) if ran_file.is_file() else None
    except Exception:
        ran = None  # unreadable: not this job's record either
    if not isinstance(ran, list) or (
        ran != overrides and ran[: len(allowed)] != allowed and ran[: len(located)] != located
    ):
        raise ConfigError(
            f"{job_dir} did not run the job {' '.join(overrides)} that {sweep / RECORD} lists "
            f"as job {number}: move it out of {sweep}, then resume again"
        )
    if record is not None and record.state == "completed":
        return []  # a finished run keeps last.ckpt to be trained further, not by a resume
    if not (job_dir / "checkpoints" / LAST).is_file():
        return []
    return [*train, override("run_dir", job_dir), *extra]


def finish_sweep(sweep: Path, extra: list[str]) -> int:
    """Run or resume every job of `sweep` not yet done; the exit status of the sweep."""
    from attnlab.reports.sweep import report_sweep

    if given := flags(extra):
        raise ConfigError(
            f"run_dir= of a sweep finishes it as it was launched, so it takes no flags "
            f"({' '.join(given)}): pass settings only"
        )
    jobs = sweep_jobs(sweep)
    numbered = {d.name for d in sweep.iterdir() if d.is_dir() and d.name.isdigit()}
    if strays := sorted(numbered - {str(n) for n in range(len(jobs))}, key=int):
        raise ConfigError(f"{sweep} lists {len(jobs)} jobs but holds job directories {strays}")
    if damaged := [why for n in range(len(jobs)) if (why := status.damage(sweep / str(n)))]:
        raise ConfigError(
            f"{damaged[0]}: restore it, or delete its job's directory to run the job afresh, "
            "then resume again"
        )
    records = {n: status.read(sweep / str(n)) for n in range(len(jobs))}
    running = [(n, r) for n, r in records.items() if r and r.state == "running" and r.alive()]
    if running:
        n, record = running[0]
        raise ConfigError(
            f"{sweep} is still running: job {n} trains (pid {record.pid} on {record.host}); "
            "finish the sweep once it has stopped"
        )
    launched_from = (_stored(sweep).get("runtime") or {}).get("cwd")
    launched_from = launched_from if isinstance(launched_from, str) else None
    commands = {
        n: job_command(sweep, n, job, records[n], extra, launched_from)
        for n, job in enumerate(jobs)
    }
    for n in (n for n, command in commands.items() if not command):
        record = records[n]
        if record is None or record.state != "completed":
            state = "holds no run" if record is None else f"is {record.state}, with no {LAST}"
            print(
                f"attnlab: job {n} ({sweep / str(n)}) {state}: left as it is; delete it and "
                "resume again to run it afresh",
                file=sys.stderr,
            )
    pending = [command for command in commands.values() if command]
    print(f"attnlab: {sweep}: {len(pending)} of {len(jobs)} jobs to run or resume", flush=True)
    stopped = run_all(pending, parallel_jobs(sweep))
    if stopped is not None:
        print(f"attnlab: stopped; finish the sweep with: {resume_command(sweep)}", file=sys.stderr)
        return 128 + stopped
    return 1 if report_sweep(sweep) < len(jobs) else 0


def run_all(commands: list[list[str]], at_once: int) -> int | None:
    """Each command a process, `at_once` at a time, each on its share of the cores. Ctrl-C or
    SIGTERM is passed on to the running jobs (which save and stop), no job starts after it,
    and this waits for them: the signal's number, or None when every job ran."""
    threads = str(max(1, (os.cpu_count() or 1) // at_once))
    env = {**os.environ, "OMP_NUM_THREADS": threads} if at_once > 1 else None
    queue, running, received = list(commands), [], []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for process in running:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while running or (queue and not received):
            running[:] = [process for process in running if process.poll() is None]
            while queue and not received and len(running) < at_once:
                # a session of its own: a terminal's Ctrl-C reaches it once, through forward
                running.append(subprocess.Popen(queue.pop(0), env=env, start_new_session=True))
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0] if received else None
