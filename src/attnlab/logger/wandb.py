"""Weights & Biases logging (`logger=wandb`): one W&B run per training run, offline by default.

- `mode`: offline (the default: `wandb sync <run dir>/wandb/offline-run-*` uploads a run
  later), online, or disabled. Online is checked within seconds, before training: without
  a login or without an answer from the W&B server, the run stops with one sentence that
  says what to do (never an interactive prompt, never wandb's own ~100 s wait).
- The mode goes to `wandb.init`, not through WANDB_MODE, which Lightning's `offline=True`
  sets for the whole process, and so for every later job of a sweep.
- `group` and `name` as attnlab.logger.naming gives them (the experiment, sweep or task; the
  choices that set the run apart); `job_type`: the task; tags: the run's tags plus `pe=…`,
  `norm=…`, `synthesizer=…`, `task=…`, `model=…`.
- The summary of the optimized metric holds its best and its last value
  (`val/acc.max`, `val/acc.last`).
- Accuracy by position (`val/acc_pos/<p>`, the probe's) goes to W&B as one table and line
  plot per evaluation (`val/acc_by_position`), not as a panel per position; the CSV logger
  keeps the columns.
- `finish` ends the W&B run. train.py calls it when a job ends, however it ends, so that
  each job of a multirun is its own W&B run.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from attnlab.errors import ConfigError
from attnlab.logger.naming import RunLabels
from attnlab.logger.storage import writable_directory
from attnlab.shell import command

log = logging.getLogger(__name__)

MODES = ("offline", "online", "disabled")
BY_POSITION = re.compile(r"(?P<stage>\w+)/acc_pos/(?P<position>\d+)")


def why_offline(timeout: float) -> str | None:
    """Why W&B cannot be used online from here (no answer from its server within `timeout`
    seconds; no login), or None. Never prompts, never waits longer."""
    import wandb
    from wandb.sdk.wandb_setup import singleton

    url = urlparse(singleton().settings.base_url)  # what wandb.init will use (WANDB_BASE_URL...)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as error:
        return f"the W&B server {url.geturl()} does not answer ({error.strerror or error})"
    # only now: with a stored key, wandb.login asks the server who it belongs to
    if not wandb.login(verify=False, prompt=False):
        return "there is no W&B login (run `wandb login` or set WANDB_API_KEY)"
    return None


def by_position_plot(stage: str, accuracy: Mapping[int, float]) -> Any:
    import wandb

    rows = [[position, accuracy[position]] for position in sorted(accuracy)]
    table = wandb.Table(columns=["position", "accuracy"], data=rows)
    return wandb.plot.line(table, "position", "accuracy", title=f"{stage} accuracy by position")


class WandbLogger(LightningWandbLogger):
    def __init__(
        self,
        save_dir: str,
        project: str,
        entity: str | None,
        mode: str,
        metric: str | None,
        metric_mode: str,
        timeout: float,
        group: str | None,
        name: str | None,
        job_type: str | None,
        tags: list[str],
    ) -> None:
        import wandb

        if mode not in MODES:
            raise ConfigError(f"logger.wandb.mode={mode!r} is not one of: {', '.join(MODES)}")
        if mode == "online" and (reason := why_offline(timeout)):
            raise ConfigError(
                f"logger.wandb.mode=online, but {reason}: log offline (logger.wandb.mode=offline) "
                "and upload later with `wandb sync <run dir>/wandb/offline-run-*`"
            )
        writable_directory(save_dir, "logger.wandb.save_dir")
        self.mode, self.metric, self.metric_mode = mode, metric, metric_mode
        run = RunLabels(group, name, job_type, tags)
        super().__init__(
            save_dir=save_dir,
            project=project,
            entity=entity,
            mode=mode,
            group=run.run_group,
            name=run.run_name,
            job_type=run.job_type,
            tags=run.all_tags,
            settings=wandb.Settings(silent=True),
        )
        # Lightning passes anonymous=None, which wandb warns about on every run
        self._wandb_init.pop("anonymous", None)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        new = self._experiment is None
        run = super().experiment
        if new:
            if self.metric:
                run.define_metric(
                    self.metric,
                    step_metric="trainer/global_step",
                    summary=f"{self.metric_mode},last",
                )
            self._say_where(ended=False)
        return run

    def _say_where(self, ended: bool) -> None:
        """wandb itself is silenced (it would print a page per job): say where the run is."""
        run = self._experiment
        if self.mode == "online":
            log.info("W&B run: %s", run.url)
        elif self.mode == "offline" and ended:
            log.info(
                "W&B run saved offline; upload it with: %s",
                command("wandb", "sync", Path(run.dir).parent),
            )
        elif self.mode == "offline":
            log.info("W&B logs this run offline, to %s", Path(run.dir).parent)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        rest: dict[str, float] = {}
        by_position: dict[str, dict[int, float]] = {}
        for key, value in metrics.items():
            match = BY_POSITION.fullmatch(key)
            if match:
                by_position.setdefault(match["stage"], {})[int(match["position"])] = value
            else:
                rest[key] = value
        if rest:
            super().log_metrics(rest, step)
        for stage, accuracy in by_position.items():
            plot = by_position_plot(stage, accuracy)
            self.experiment.log({f"{stage}/acc_by_position": plot, "trainer/global_step": step})

    @rank_zero_only
    def finish(self, exit_code: int = 0) -> None:
        """End the W&B run (a later job in this process starts its own)."""
        if self._experiment is None:
            return
        self._say_where(ended=True)
        self._experiment.finish(exit_code=exit_code)
        self._experiment = None
