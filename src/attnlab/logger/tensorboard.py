"""TensorBoard logging (`logger=tensorboard`, beside the CSV logger): event files in
<run dir>/tensorboard/, read with `tensorboard --logdir logs/<task>/multiruns/<time>` for a
sweep. A run's name, group and tags (attnlab.logger.naming) are recorded with its config in
<run dir>/tensorboard/hparams.yaml."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger

from attnlab.logger.naming import RunLabels
from attnlab.logger.storage import writable_directory


class TensorBoardLogger(LightningTensorBoardLogger):
    def __init__(
        self, save_dir: str, group: str | None, name: str | None, job_type: str, tags: list[str]
    ) -> None:
        writable_directory(save_dir, "logger.tensorboard.save_dir")
        super().__init__(save_dir=save_dir, name="tensorboard", version="", default_hp_metric=False)
        run = RunLabels(group, name, job_type, tags)
        self.run = {"name": run.run_name or "", "group": run.run_group or "", "tags": run.all_tags}

    def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
        super().log_hyperparams({"run": self.run, **dict(params)}, metrics)
