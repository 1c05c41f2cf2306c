"""Train one configuration: `python train.py pe=rope norm=l2 task=probe` (see README).

Returns the best value of `optimized_metric`, so Hydra sweepers can optimize over runs.
Every run records its state in <run dir>/status.json (`attnlab.runner.status`). In a -m sweep, a
job that fails is recorded there with its traceback, logged, and scored NaN (Optuna marks
the trial failed), and the sweep goes on; the sweep ends by printing the comparison of its jobs and
exits non-zero if any failed (`attnlab.reports.sweep`).
Lightning is imported inside the functions, so `--help` and config errors stay fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from attnlab.config.options import CONF_DIR
from attnlab.config.resolvers import register_resolvers
from attnlab.errors import (
    ELSEWHERE,
    ConfigError,
    Diverged,
    MachineError,
    check_writable,
    refused_by_machine,
)

if TYPE_CHECKING:
    import lightning as L

    from attnlab.systems.base import System

log = logging.getLogger(__name__)

STOPS = (ConfigError, Diverged, MachineError)  # errors that say everything in one sentence


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit, then test the best checkpoint; returns the final metrics, and the best value of
    the optimized metric as `best/<metric>`."""
    import lightning as L
    from lightning.pytorch.utilities import rank_zero_only

    from attnlab import status
    from attnlab.runner.checkpoints import RunRecord
    from attnlab.runner.devices import check_sweep_devices, device_name
    from attnlab.runner.job import command_line_overrides
    from attnlab.runner.loggers import (
        closing_loggers,
        log_hyperparameters,
        logged_config,
        quiet_library_noise,
    )
    from attnlab.runner.plan import Plan, build_datamodule, build_system, resolve_output_dir
    from attnlab.runner.resume import RECORD_KEY, absolute_locations, read_checkpoint, run_directory
    from attnlab.runner.same_model import check_same_model
    from attnlab.runner.status import tracking
    from attnlab.runner.summary import (
        closing_summary,
        print_config,
        report,
        save_config_tree,
    )
    from attnlab.runner.trainer import accumulate_for, build_trainer

    quiet_library_noise()
    output_dir = resolve_output_dir(cfg)
    resuming = cfg.ckpt_path is not None and run_directory(Path(cfg.ckpt_path)) == Path(output_dir)
    first = rank_zero_only.rank == 0  # the process that writes the run's files
    if first and not resuming and (Path(output_dir) / status.FILE).is_file():
        raise holds_a_run(output_dir)  # main() refuses it first, where the command line says
    if cfg.extras.print_config:
        print_config(cfg)
    with tracking(Path(output_dir), enabled=first, resumed=resuming) as tracker:
        save_config_tree(cfg, output_dir)
        plan = Plan.from_config(cfg)  # the config as data, checked before any data is read
        config = plan.config
        check_sweep_devices(config)
        L.seed_everything(config["seed"], workers=True)
        datamodule = build_datamodule(config)
        if config["test"] and not datamodule.has_split("test"):
            raise ConfigError(
                "the data has no test split: pass test=false (and evaluate split=val with eval.py)"
            )
        if config["ckpt_path"] is not None:
            stored = read_checkpoint(config["ckpt_path"])[RECORD_KEY]["config"]
            check_same_model(config, stored, "train.py ckpt_path=...")
        system = build_system(plan, datamodule)
        counts = system.parameter_counts()
        tracker.update(params=counts["total"])
        overrides = absolute_locations(command_line_overrides(), config["paths"]["root_dir"])
        record = RunRecord(overrides, config)
        trainer = build_trainer(config, [record])
        accumulate_for(trainer, datamodule)
        tracker.update(device=device_name(trainer.strategy.root_device))
        try:
            with closing_loggers(trainer):
                log_hyperparameters(trainer, logged_config(config, system))
                metrics = fit_and_test(config, trainer, system, datamodule)
        finally:
            tracker.update(steps=trainer.global_step)
    if first:
        report(closing_summary(config, counts, metrics, output_dir))
    return metrics


def fit_and_test(
    config: dict[str, Any], trainer: L.Trainer, system: System, datamodule: L.LightningDataModule
) -> dict[str, float]:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from attnlab.logger.csv import CSVLogger
    from attnlab.runner.checkpoints import LatestCheckpoint, best_checkpoint
    from attnlab.runner.summary import scalar_metrics

    metrics: dict[str, float] = {}
    checkpoint = best_checkpoint(trainer)
    if config["train"]:
        fit(trainer, system, datamodule, config["ckpt_path"])
        # a SIGTERM after fit's last look at it, which trainer.test would forget: the state is
        # saved (on_train_end), and the resumed run tests
        stop = trainer.strategy.reduce_boolean_decision(trainer.received_sigterm, all=False)
        if stop and config["test"]:
            raise SIGTERMException
        metrics.update(averaged_over_ranks(trainer, scalar_metrics(trainer.callback_metrics)))
        if checkpoint is not None and checkpoint.best_model_score is not None:
            metrics[f"best/{config['optimized_metric']}"] = float(checkpoint.best_model_score)
    if config["test"]:
        best = checkpoint.best_model_path if checkpoint is not None else ""
        if not best:
            log.warning("no best checkpoint was saved: testing the final weights")
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.drop_tests()  # a run killed after its test tests again, whole
        (results,) = trainer.test(system, datamodule, ckpt_path=best or None, verbose=False)
        metrics.update(scalar_metrics(results))
    if config["train"]:
        for callback in trainer.callbacks:
            if isinstance(callback, LatestCheckpoint):
                callback.drop(trainer)
    return metrics


def fit(
    trainer: L.Trainer, system: System, datamodule: L.LightningDataModule, ckpt_path: str | None
) -> None:
    """trainer.fit, with Lightning's refusal of a validation period longer than an epoch
    said as the setting to change."""
    try:
        trainer.fit(system, datamodule, ckpt_path=ckpt_path)
    except ValueError as error:
        found = re.search(
            r"`val_check_interval` \((\d+)\) .* training batches \((\d+)\)", str(error)
        )
        if found is None:
            raise
        interval, batches = found.groups()
        raise ConfigError(
            f"trainer.val_check_interval={interval} is more than the {batches} training batches "
            f"of an epoch: give at most {batches}, a fraction of an epoch (0.5), or count "
            "batches across epochs with trainer.check_val_every_n_epoch=null"
        ) from None


def averaged_over_ranks(trainer: L.Trainer, metrics: dict[str, float]) -> dict[str, float]:
    """The training metrics (each DDP rank logged its own batches' values) averaged over the
    ranks; validation and test metrics are already computed over every rank's share."""
    import torch

    if trainer.world_size == 1:
        return metrics
    averaged = {}
    for key in sorted(metrics):  # the same collectives, in the same order, on every rank
        if key.startswith("train/"):
            value = torch.tensor(metrics[key], dtype=torch.float64)
            averaged[key] = float(trainer.strategy.reduce(value, reduce_op="mean"))
    return metrics | averaged


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def train_main(cfg: DictConfig) -> float | None:
    from attnlab.runner.job import in_sweep
    from attnlab.tensors import flush_denormals

    flush_denormals()  # again: a launcher's worker process (joblib, submitit) starts here
    register_resolvers()

    try:
        with sigterm_stops():
            metrics = train(cfg)
    except SystemExit as exit_:  # Lightning's answer to Ctrl-C (exit 1) and SIGTERM (exit 0)
        raise SystemExit(interrupted(cfg)) from exit_
    except Exception as error:
        stop = error if isinstance(error, STOPS) else refused_by_machine(error)
        if isinstance(stop, MachineError) and (command := resumable(cfg)) is not None:
            stop = MachineError(f"{stop}; then resume with: {command}")
        if not in_sweep():
            if stop is not None:
                raise SystemExit(f"attnlab: {stop}") from None
            raise
        if stop is not None:
            log.error("this job failed, the sweep goes on: %s", stop)
        else:
            log.exception("this job failed, the sweep goes on")
        return float("nan")  # what Optuna records as a failed trial
    metric = cfg.optimized_metric
    return metrics.get(f"best/{metric}", metrics.get(metric))


def resumable(cfg: DictConfig) -> str | None:
    """The command that resumes this run, if it has a checkpoint to resume from. A resume
    takes no `paths.*` from the checkpoint, so a cache directory of the run's own is named."""
    from attnlab.runner.resume import LAST
    from attnlab.shell import override, resume_command

    run_dir = Path(cfg.paths.output_dir).resolve()
    if not (run_dir / "checkpoints" / LAST).is_file():
        return None
    data_dir = Path(cfg.paths.data_dir).resolve()
    own_cache = data_dir != (Path(cfg.paths.root_dir) / "data").resolve()
    return resume_command(run_dir, *([override("paths.data_dir", data_dir)] if own_cache else []))


def interrupted(cfg: DictConfig) -> str:
    from attnlab.runner.job import is_sweep_job
    from attnlab.shell import resume_command

    run_dir = Path(cfg.paths.output_dir).resolve()
    if is_sweep_job(run_dir):  # the sweep goes on from where it stopped, this job included
        return f"attnlab: interrupted; finish the sweep with: {resume_command(run_dir.parent)}"
    command = resumable(cfg)
    if command is None:
        return "attnlab: interrupted before its first checkpoint; there is nothing to resume"
    return f"attnlab: interrupted; resume with: {command}"


class StopOnSigterm:
    """SIGTERM where Lightning's handler is not installed (a run setting up, between fit and
    test, reporting) ends the run as an interrupt: its status says so and its lock is freed
    (the default would kill it with both left as running). Inside fit, Lightning's handler,
    which calls this one too, stops the run at the end of the step, and this one does nothing."""

    def __call__(self, signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGTERM) is self:
            raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """StopOnSigterm installed while the block runs (in the main thread only: a launcher's
    worker thread cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, StopOnSigterm())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# where Lightning reads a process's rank; read here before Lightning is imported
RANKS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def first_process() -> bool:
    return all(os.environ.get(name, "0") == "0" for name in RANKS)


def check_directories(args: list[str]) -> None:
    """Refuse, before Hydra writes its config and log there, a directory that this command
    must not write into: a refused command changes nothing."""
    from attnlab.runner.command_line import is_multirun, value

    args = [arg.lstrip("+") for arg in args]
    if is_multirun(args):
        sweep = value(args, "hydra.sweep.dir")
        if sweep is not None:
            check_sweep_directory(Path(sweep))
        return
    run_dir = value(args, "hydra.run.dir")
    if run_dir is not None:
        check_run_directory(Path(run_dir), value(args, "ckpt_path"))


def check_run_directory(run_dir: Path, checkpoint: str | None) -> None:
    """Refuse a directory that another process writes, that holds a run which this one
    does not continue (from `checkpoint`), that cannot be written, or that a link leads out
    of; so too the run directory `checkpoint` is named under (a fork's, made of links)."""
    from attnlab import status
    from attnlab.runner import lock
    from attnlab.runner.resume import named_run_directory, run_directory

    resuming = checkpoint not in (None, "null")
    lock.check_contained(run_dir)
    if resuming and (named := named_run_directory(Path(checkpoint))) is not None:
        lock.check_contained(named)
    lock.check_free(run_dir)
    continues = resuming and run_directory(Path(checkpoint)) == run_dir.resolve()
    if not continues and status.holds_run(run_dir):
        raise holds_a_run(run_dir)
    check_writable(run_dir, resumed_elsewhere(run_dir) if continues else ELSEWHERE)


def resumed_elsewhere(run_dir: Path) -> str:
    """What to do with a run that a resume cannot write in: paths.log_dir does not move a
    resumed run, a copy of it resumes in its own directory."""
    from attnlab.shell import command

    return (
        f"a resume writes in its run's directory, so make it writable, or copy the run to a "
        f"writable place and resume the copy ({command('cp', '-a', run_dir)} <copy>, then "
        f"{command('python', 'train.py')} run_dir=<copy>)"
    )


def holds_a_run(run_dir: Path | str) -> ConfigError:
    from attnlab.shell import command, override

    return ConfigError(
        f"{run_dir} already holds a run: resume it with {command(override('run_dir', run_dir))}, "
        "or start this one in a new directory (leave hydra.run.dir to its default)"
    )


def check_sweep_directory(sweep: Path) -> None:
    """Refuse a sweep directory that holds runs, or whose directories (its jobs') do, or that
    a link leads out of."""
    from attnlab import status
    from attnlab.runner import lock

    lock.check_contained(sweep)
    inside = sorted(d for d in sweep.iterdir() if d.is_dir()) if sweep.is_dir() else []
    taken = [d for d in (sweep, *inside) if status.holds_run(d)]
    if taken:
        more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
        raise ConfigError(
            f"{sweep} already holds runs ({taken[0]}{more}): start this sweep in a new "
            "directory (leave hydra.sweep.dir to its default), or resume one of its runs with "
            "run_dir=<its directory>"
        )


def check_launcher(args: list[str]) -> None:
    """Refuse the SLURM launcher where there is no SLURM (submitit looks for srun)."""
    import shutil

    from attnlab.runner.command_line import value

    if value(args, "hydra/launcher") == "slurm" and shutil.which("srun") is None:
        raise ConfigError(
            "hydra/launcher=slurm submits the sweep to SLURM, and this machine has no SLURM "
            "(no srun on its PATH): run the command on the cluster's login node, or run the "
            "sweep here with hydra/launcher=joblib"
        )


def main() -> None:
    """A resumed run (`ckpt_path=...`, `run_dir=...`) is rebuilt from what it stored, ahead of
    the command line (`attnlab.runner.job`); `run_dir=<sweep dir>` finishes a sweep
    (`attnlab.runner.sweep_resume`); any other run is Hydra's app on the command line."""
    from attnlab.runner import command_line
    from attnlab.runner.job import run_composed
    from attnlab.runner.preflight import check_setting_keys, usage
    from attnlab.runner.resume import check_restored, training_arguments
    from attnlab.runner.sweep_resume import finish_sweep, is_sweep

    register_resolvers()
    args = command_line.given()
    if command_line.asks_help(args):  # Hydra's lists every group: 10 s or more
        print(usage("train"))
        return
    try:
        run_dir = command_line.value(args, "run_dir")
        if run_dir is not None and is_sweep(Path(run_dir)):
            raise SystemExit(finish_sweep(Path(run_dir), command_line.without(args, "run_dir")))
        resumed = training_arguments(args)
        if resumed is None:
            args = check_setting_keys(args, "train")
            command_line.hand_to_hydra(args)  # with ++ for the Trainer's unlisted arguments
        else:
            from_run = [arg for arg in resumed if arg not in args]
            resumed = check_setting_keys(resumed, "train", stored=from_run)
            check_restored(resumed)
        if first_process():  # the others run in rank 0's directory
            check_directories(args if resumed is None else resumed)
        check_launcher(args)
    except ConfigError as error:
        raise SystemExit(f"attnlab: {error}") from None
    if resumed is None:
        train_main()
    else:
        run_composed("train", resumed, train_main)


if __name__ == "__main__":
    main()
