"""Every logged metric to <run dir>/csv/metrics.csv (`logger=csv`, also under logger=wandb).

Lightning's CSVLogger deletes the metrics file of the directory it writes to; a resumed run
writes to the directory of the run it continues, so this one keeps the file and appends.
Rows that the interrupted run logged after its latest checkpoint are work the resumed run
does again: `drop_after` removes them before it does (attnlab.runner.checkpoints.ExactResume),
and `drop_tests` the rows of a test it does again (attnlab.runner.train.fit_and_test).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from attnlab.errors import ConfigError
from attnlab.files import written
from attnlab.logger.rows import logged_step
from attnlab.logger.storage import writable_directory


def done_by(row: dict[str, str], step: int) -> bool:
    """Whether a row records work done by the time `step` optimizer steps were taken.

    Lightning logs with the count of optimizer steps before the batch that logs: a batch's
    training metrics with the count before its step (the loss of the first batch at step 0),
    and a validation run after a batch's step, in the training loop (at an epoch's end, at
    val_check_interval, at the last step), with the count before that step too (a validation
    after 16 steps at step 15). Test rows are the test's to drop (`drop_tests`). A last row
    cut short by a kill (no step) is work after any checkpoint."""
    logged = logged_step(row.get("step") or "")
    return logged is not None and logged < step


def check_steps(path: str, rows: list[dict[str, str]]) -> None:
    """A ConfigError naming the first of `rows` (a metrics file's, from its second line) whose
    step is no count of steps: an edited file, refused before it is rewritten."""
    for number, row in enumerate(rows, 2):
        if logged_step(row.get("step") or "") is None:
            raise ConfigError(
                f"{path} line {number} holds {row.get('step')!r} for step, which is not a "
                "count of steps: restore that line (or delete it), then resume"
            )


class AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        """Continue the metrics file there is (Lightning's writer deletes it)."""
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])

    def keep_only(self, kept: Callable[[dict[str, str]], bool]) -> None:
        """Rewrite the metrics file with the rows that `kept` accepts."""
        self.save()
        if not os.path.isfile(self.metrics_file_path):
            return
        with open(self.metrics_file_path, newline="") as file:
            rows = list(csv.DictReader(file))
        check_steps(self.metrics_file_path, rows[:-1])  # the last may be cut short
        path = Path(self.metrics_file_path)
        with written(path, durable=True) as partial, partial.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(row for row in rows if kept(row))


class CSVLogger(LightningCSVLogger):
    def __init__(self, save_dir: str, name: str, version: str) -> None:
        writable_directory(save_dir, "logger.csv.save_dir")
        super().__init__(save_dir=save_dir, name=name, version=version)

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def drop_after(self, step: int) -> None:
        """Remove the rows of work done after `step` optimizer steps (see the module doc)."""
        self.experiment.keep_only(lambda row: done_by(row, step))

    @rank_zero_only
    def drop_tests(self) -> None:
        """Remove the rows of a test (one that a run killed after it tests again, whole)."""
        self.experiment.keep_only(
            lambda row: not any(row.get(k) for k in row if k.startswith("test/"))
        )
