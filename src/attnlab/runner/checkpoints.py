"""What a checkpoint holds, how it is written, and how it is read back safely.

- `last.ckpt` is the latest state (`LatestCheckpoint`): written at the end of every epoch,
  every `every_n_minutes` (or `every_n_steps`) inside an epoch, at the end of training, and
  when a run is interrupted (Ctrl-C, SIGTERM) or fails, except when it diverged (the last
  finite state is worth more). An interrupted run logs the command that resumes it. A
  `fast_dev_run` (debug=fast: does the configuration run?) writes none, as Lightning's own.
- A save inside an epoch is written to `last.ckpt.pending` and takes last.ckpt's place at
  the next hook, once the batch's metrics row is in the metrics file: Lightning logs that
  row after the callbacks' on_train_batch_end, and a state saved there and killed before
  the row was written resumed after that batch, its row lost for good.
- The best checkpoint (`epoch_NNN.ckpt`; `step_NNNNNN.ckpt` in a run that validates by steps:
  attnlab.config.resolvers.validates_by_steps) holds the weights, the tokenizers and the run's
  record: what evaluation needs, not the optimizer (`save_weights_only`). `last.ckpt` holds
  the whole training state, and a finished run (trained and tested) drops it where
  `keep_when_done` is false: a run stopped in its test resumes to its test, not to more
  training (the state records that training had stopped, which Lightning does not).
- A checkpoint carries what an exact resume needs besides Lightning's own state (`ExactResume`:
  the random generators, the position in the epoch's batches) and the run's record
  (`RunRecord`: its overrides and resolved config).
- `AtomicCheckpointIO` writes a checkpoint beside its target, syncs it to disk and renames
  it over the target: a save cut short leaves the previous checkpoint whole, and nothing in
  $TMPDIR. It reads checkpoints with `weights_only=True` (tensors and plain data: reading
  one runs no code) and refuses remote ones.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.loops.progress import (
    _BatchProgress,
    _OptimizationProgress,
    _Progress,
    _SchedulerProgress,
)
from lightning.pytorch.utilities.exceptions import SIGTERMException

from attnlab.data.loader import ResumableLoader
from attnlab.errors import ConfigError, Diverged, MachineError
from attnlab.files import durable_replace, written
from attnlab.logger.csv import CSVLogger
from attnlab.runner.resume import LAST

log = logging.getLogger(__name__)

RESUME_KEY = "attnlab_resume"  # checkpoint entry: random states and position in the epoch


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with written(path, durable=True) as partial, partial.open("wb") as file:
            torch.save(checkpoint, file)  # a refusal keeps the previous checkpoint whole
            file.flush()
            os.fsync(file.fileno())
        for stale in path.parent.glob(f".{path.name}.partial-*"):
            stale.unlink(missing_ok=True)  # a save killed halfway by an earlier process

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if "://" in str(path):
            raise ConfigError(f"{path} is a URL: download the checkpoint and pass its local path")
        return torch.load(path, map_location=map_location, weights_only=True)


class RunRecord(L.Callback):
    """Gives the system the run's overrides and resolved config, which it stores in every
    checkpoint (`System.on_save_checkpoint`, called also for the best checkpoint's weights-only
    save, where callbacks are not), so that `eval.py ckpt_path=...` can rebuild the run
    without its log directory."""

    def __init__(self, overrides: list[str], config: dict[str, Any]) -> None:
        self.record = {"overrides": overrides, "config": config}

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        module.run_record = self.record


def random_states() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [
            numpy_state[0],
            torch.from_numpy(numpy_state[1].astype(np.int64)),
            *numpy_state[2:],
        ],
        "python": random.getstate(),
    }


def set_random_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, *rest = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


EPOCH_START_RESETS = {  # what Lightning's loops reset when an epoch starts, by checkpoint key
    "epoch_loop.batch_progress": _BatchProgress,
    "epoch_loop.scheduler_progress": _SchedulerProgress,
    "epoch_loop.automatic_optimization.optim_progress": _OptimizationProgress,
}


def as_next_epoch(fit_loop: dict[str, Any]) -> None:
    """Rewrite the fit loop's state saved at an epoch's end (on_train_epoch_end) as the
    state between that epoch and the next: the epoch completed (FitLoop.on_advance_end) and
    the per-epoch counters reset (_TrainingEpochLoop.reset). Lightning restores the former
    as an epoch to finish: it ran an empty pass that moved the sampler's epoch one ahead and
    counted one batch too many in the logged step (a SIGKILLed run resumed from it trained
    on other batches than the uninterrupted run)."""
    epoch = _Progress()
    epoch.load_state_dict(fit_loop["epoch_progress"])
    epoch.increment_completed()
    fit_loop["epoch_progress"] = epoch.state_dict()
    for key, kind in EPOCH_START_RESETS.items():
        progress = kind()
        progress.load_state_dict(fit_loop[key])
        progress.reset_on_run()
        fit_loop[key] = progress.state_dict()
    validation = _BatchProgress()
    validation.load_state_dict(fit_loop["epoch_loop.val_loop.batch_progress"])
    validation.total.reset()  # validation batches of the epoch, for val_check_interval
    fit_loop["epoch_loop.val_loop.batch_progress"] = validation.state_dict()


def at_epoch_end(trainer: L.Trainer) -> bool:
    """Whether the fit loop is in an epoch's end hooks (processed, not yet completed)."""
    progress = trainer.fit_loop.epoch_progress.current
    return progress.processed > progress.completed


class ExactResume(L.Callback):
    """What Lightning leaves out of a checkpoint for a resume to reach the weights of the
    uninterrupted run: the random generators' states (dropout draws from them) and how many
    batches of the epoch were done. Both are put back when training
    starts, after everything else is restored (Lightning builds the training loader early,
    for `estimated_stepping_batches`, before it restores a loader's own state). A checkpoint
    written at an epoch's end holds the loops as the next epoch's start (`as_next_epoch`)."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None

    def on_save_checkpoint(
        self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict
    ) -> None:
        # batches of this epoch whose optimizer step is done (not those only fetched)
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        between = at_epoch_end(trainer) and "loops" in checkpoint
        if between:
            as_next_epoch(checkpoint["loops"]["fit_loop"])
            done = 0
        checkpoint[RESUME_KEY] = {"random": random_states(), "done": done, "between": between}

    def on_load_checkpoint(
        self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict
    ) -> None:
        self.pending = checkpoint.get(RESUME_KEY)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.pending is None:
            return
        set_random_states(self.pending["random"])
        if self.pending.get("between"):  # the next epoch starts as a new one, not a restart:
            trainer.fit_loop.epoch_loop.restarting = False  # no step of validation to skip
        loader, done = trainer.train_dataloader, self.pending["done"]
        if isinstance(loader, ResumableLoader) and 0 < done < len(loader):
            loader.resume_after(done)  # mid-epoch; at an epoch's end the next one starts
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.drop_after(trainer.global_step)  # what the resumed run does again
        self.pending = None


def ends_training_or_epoch(trainer: L.Trainer) -> bool:
    """Whether the batch just trained is its epoch's last or training's (max_steps): a save
    there would come before the validation that follows, and a run resumed from it, with
    nothing left to train, would not validate again (its best checkpoint and logged step
    one validation stale)."""
    done = 0 <= trainer.max_steps <= trainer.global_step
    return done or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch


def best_checkpoint(trainer: L.Trainer) -> ModelCheckpoint | None:
    """The callback that keeps the best checkpoint, if the run has one (Lightning's
    `trainer.checkpoint_callback` is the first Checkpoint, which may be LatestCheckpoint)."""
    return next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)


def drop_orphan_bests(keeper: ModelCheckpoint | None, resumed: Path) -> None:
    """Remove the best checkpoints that a killed process wrote after `resumed`, the state this
    run goes on from, which the restored best-checkpoint callback does not know: the resumed
    run validates again and writes its own (killed between the best checkpoint's save and
    last.ckpt's, such a file was left beside the run's best for good)."""
    if keeper is None or keeper.dirpath is None or not resumed.is_file():
        return
    prefix = (keeper.filename or "").split("{")[0]
    if not prefix:  # no name of the keeper's own to tell its files by
        return
    known = {Path(p).resolve() for p in (*keeper.best_k_models, keeper.best_model_path) if p}
    since = resumed.stat().st_mtime
    for path in Path(keeper.dirpath).glob(f"{prefix}*.ckpt"):
        if path.resolve() not in known | {resumed.resolve()} and path.stat().st_mtime > since:
            log.info("removing %s, written after the checkpoint this run resumes from", path)
            path.unlink(missing_ok=True)


class LatestCheckpoint(Checkpoint):
    """Keeps checkpoints/last.ckpt the latest state (see the module docstring). Ctrl-C, like
    SIGTERM, stops the run at the end of the current step (a second Ctrl-C stops it at once,
    without a checkpoint: a step cut halfway is no state to resume from).

    A Checkpoint, so that Lightning calls its on_train_epoch_end with the callbacks that
    monitor a metric, after every other callback, and after early stopping and the best
    checkpoint have taken the epoch's validation into their state (`run.build_trainer` puts
    it last): as a plain callback its epoch-end save held their state of one validation
    before, and a run resumed from it stopped late or tested a stale best checkpoint."""

    def __init__(
        self,
        dirpath: str,
        every_n_minutes: float | None,
        every_n_steps: int | None,
        keep_when_done: bool,  # the runner decides callbacks.latest's null (run.build_callback)
    ) -> None:
        if every_n_minutes is not None and every_n_steps is not None:
            raise ConfigError(
                "callbacks.latest takes every_n_minutes or every_n_steps, not both: set the "
                "other to null"
            )
        if every_n_steps is not None and (every_n_steps < 1 or every_n_steps % 1):
            raise ConfigError(
                f"callbacks.latest saves every {every_n_steps} steps: give a whole number of at "
                "least 1, or null"
            )
        if every_n_minutes is not None and every_n_minutes <= 0:
            raise ConfigError(
                f"callbacks.latest saves every {every_n_minutes} minutes: give a positive "
                "number, or null"
            )
        self.path = Path(dirpath) / LAST
        self.pending = self.path.with_name(f"{LAST}.pending")  # a step's save, until its row
        self.uncommitted = False  # a save in `pending`: no file check at every step
        self.every_n_minutes, self.every_n_steps = every_n_minutes, every_n_steps
        self.keep_when_done = keep_when_done
        self.saved_at = time.monotonic()
        self.saved_step = -1
        self.stopped = False  # trainer.should_stop at the last save
        self.previous_handler: Any = None

    def save(self, trainer: L.Trainer, path: Path | None = None) -> None:
        if trainer.fast_dev_run:  # a check that the configuration runs (debug=fast): no state
            return
        self.stopped = trainer.should_stop  # early stopping's decision, for state_dict
        trainer.save_checkpoint(path or self.path, weights_only=False)  # the whole state
        self.saved_at, self.saved_step = time.monotonic(), trainer.global_step

    def commit(self, trainer: L.Trainer) -> None:
        """The step's save becomes last.ckpt: its metrics row is written (module docstring)."""
        if self.uncommitted and trainer.is_global_zero and self.pending.is_file():
            durable_replace(self.pending, self.path)
        self.uncommitted = False

    def discard(self, trainer: L.Trainer) -> None:
        """A step's save whose row may not be written (killed, or stopped by an error)."""
        if trainer.is_global_zero:
            self.pending.unlink(missing_ok=True)
        self.uncommitted = False

    def state_dict(self) -> dict[str, Any]:
        return {"should_stop": self.stopped}

    def on_load_checkpoint(
        self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict
    ) -> None:
        """Lightning resets `trainer.should_stop` on fit: a run that early stopping (or a time
        limit) had stopped would train on; it resumes stopped, to its test."""
        state = checkpoint.get("callbacks", {}).get(self.state_key, {})
        trainer.should_stop = trainer.should_stop or state.get("should_stop", False)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.saved_at = time.monotonic()
        self.discard(trainer)  # left by a process killed before its row was written
        if trainer.is_global_zero and trainer.ckpt_path is not None:
            drop_orphan_bests(best_checkpoint(trainer), Path(trainer.ckpt_path))
        if threading.current_thread() is threading.main_thread():
            handler = functools.partial(self.on_ctrl_c, trainer)
            self.previous_handler = signal.signal(signal.SIGINT, handler)

    def on_ctrl_c(self, trainer: L.Trainer, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, self.previous_handler)
        log.warning("Ctrl-C: stopping at the end of this step (Ctrl-C again: at once, unsaved)")
        trainer._signal_connector.received_sigterm = True  # Lightning's stop, as on SIGTERM

    def teardown(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if self.previous_handler is not None:
            signal.signal(signal.SIGINT, self.previous_handler)
            self.previous_handler = None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if ends_training_or_epoch(trainer):  # saved at the epoch's end, after its validation
            return
        if trainer.fit_loop.epoch_loop._should_accumulate():  # gradients held, not stepped
            return
        if self.every_n_steps is not None:
            due = trainer.global_step % self.every_n_steps == 0
        else:
            elapsed = time.monotonic() - self.saved_at
            due = self.every_n_minutes is not None and elapsed >= 60 * self.every_n_minutes
        # every rank must take part in a save: decide together
        if trainer.strategy.reduce_boolean_decision(due, all=False):
            self.save(trainer, self.pending)
            self.uncommitted = True

    # the hooks that can come first after a step's row is logged
    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.commit(trainer)

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.commit(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.discard(trainer)  # this save is later
        self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """Training finished (its step budget, early stopping, max_epochs; an interrupt is
        on_exception): the final state, kept until the run is done (`drop`)."""
        self.commit(trainer)
        if trainer.global_step != self.saved_step or trainer.should_stop != self.stopped:
            self.save(trainer)

    def drop(self, trainer: L.Trainer) -> None:
        """The run is done (trained, and tested where it tests): with keep_when_done false,
        no training state, where a best checkpoint holds the weights (never the only ones)."""
        keeper = best_checkpoint(trainer)
        best = keeper.best_model_path if keeper is not None else ""
        if not self.keep_when_done and best and trainer.is_global_zero and self.path.is_file():
            self.path.unlink()
            log.info("run done: %s dropped (keep_when_done=false)", self.path)

    def on_exception(
        self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException
    ) -> None:
        """Save, unless the state is not worth resuming (a diverged run, or a step cut short
        by a second Ctrl-C: every other stop comes between steps, or before a step changed
        anything) or cannot be saved (the machine refused the last save); under DDP only a
        stop that every rank shares (SIGTERM) is saved."""
        self.discard(trainer)
        unsaveable = (Diverged, MachineError, KeyboardInterrupt)
        if isinstance(exception, unsaveable) or trainer.state.fn != "fit":
            return
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException):
            return
        if trainer.global_step > 0 and not trainer.fast_dev_run:
            self.save(trainer)
            interrupted = isinstance(exception, SystemExit)  # Lightning's stop: Ctrl-C, SIGTERM
            stop = "Ctrl-C or SIGTERM" if interrupted else type(exception).__name__
            log.warning(
                "stopped by %s at step %d; the latest state is in %s",
                stop, trainer.global_step, self.path,
            )  # fmt: skip
