"""What a run logs, and to where: the config loggers record, closing what they keep open, and
the libraries' console noise left out."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L

from attnlab.config.groups import DESCRIPTIVE, OUTPUT, REPORTING
from attnlab.logger.wandb import WandbLogger
from attnlab.systems.base import System


def quiet_library_noise() -> None:
    """Print each log line once and skip a warning that is not ours.

    Lightning and torchmetrics add their own stderr handler yet still propagate to the root
    logger, which Hydra has pointed at the console and the run's log file: drop theirs.
    Lightning 2.6 trips torch's LeafSpec deprecation on every rank; nothing to act on.
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        logging.getLogger(name).handlers.clear()
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database set-up, every run
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, LightningChatter) for f in rank_zero.filters):
        rank_zero.addFilter(LightningChatter())
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # attnlab.runner.checkpoints.ExactResume puts the loader back where it was, after this warning
    warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")


class LightningChatter(logging.Filter):
    """Drops what Lightning says on every run that asks nothing of the user: its "💡 Tip"
    about a cloud logger, and that it keeps attnlab's model summary callback."""

    PREFIXES = ("💡 Tip", "Trainer already configured with model summary callbacks")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.PREFIXES)


NOT_LOGGED = (*OUTPUT, *REPORTING)  # where outputs go, not what ran


# settings that locate files on one machine, relative or absolute: not logged
LOCATIONS = ("dir", "file", "test_src", "test_tgt", "cache_dir", "data_dir")


def _portable(node: Any) -> Any:
    """`node` without metadata keys and without file locations (machine-specific)."""
    if isinstance(node, dict):
        return {
            key: _portable(value)
            for key, value in node.items()
            if key not in (*DESCRIPTIVE, *LOCATIONS)
            and not (isinstance(value, str) and os.path.isabs(value))
        }
    if isinstance(node, list):
        return [_portable(item) for item in node]
    return node


def logged_config(config: dict[str, Any], system: System) -> dict[str, Any]:
    """What loggers and dashboards record of a run: the resolved config with the groups at
    the top level (pe, norm, synthesizer, task, model, optim, trainer, ...) and what the
    system reports about itself (parameter counts; for translation, sacreBLEU's signature)."""
    config = _portable({k: v for k, v in config.items() if k not in NOT_LOGGED})
    config["optim"] = config["task"].pop("optim")
    config["task"].pop("max_epochs", None)  # trainer.max_epochs holds what the run used
    return {**config, **system.describe()}


def log_hyperparameters(trainer: L.Trainer, config: dict[str, Any]) -> None:
    for logger in trainer.loggers:
        logger.log_hyperparams(config)


@contextmanager
def closing_loggers(trainer: L.Trainer) -> Iterator[None]:
    """End what loggers keep open across a job (a W&B run) when the block ends, however it
    ends, so that the next job of a sweep in this process starts its own."""
    failed = True
    try:
        yield
        failed = False
    finally:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.finish(exit_code=int(failed))
