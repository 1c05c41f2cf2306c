"""Lightning's Trainer of a run: its loggers and callbacks from the config, the two callbacks every
run has, and the batches the data puts into one optimizer step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor

from attnlab.config.build import MACHINERY, build
from attnlab.data.task import TaskData
from attnlab.errors import ConfigError  # fmt: skip
from attnlab.runner.callbacks import ScoredExamples, ValidateAtEnd
from attnlab.runner.checkpoints import LatestCheckpoint
from attnlab.runner.devices import check_accelerator
from attnlab.runner.job import in_sweep, is_sweep_job
from attnlab.runner.plan import resolve_output_dir


def accumulate_for(trainer: L.Trainer, datamodule: TaskData) -> None:
    """Accumulate the batches that the data puts into one optimizer step (before fit)."""
    batches = datamodule.batches_per_step(trainer.world_size)
    if batches is None:
        return
    if trainer.accumulate_grad_batches != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches} and the "
            f"data's tokens per step ({batches} batches) both set the batches of a step: "
            "keep one"
        )
    trainer.accumulate_grad_batches = batches


def build_trainer(config: dict[str, Any], extra_callbacks: list[L.Callback] = ()) -> L.Trainer:
    """The trainer with the config's loggers and callbacks, `extra_callbacks`, and the two
    every run has: validation of the final weights, and the count of examples scored."""
    check_accelerator(str(config["trainer"].get("accelerator", "auto")))
    loggers = [build(node, MACHINERY) for node in switched_on(config.get("logger"))]
    sweep_job = in_sweep() or is_sweep_job(Path(resolve_output_dir(config)))
    callbacks = [build_callback(node, sweep_job) for node in switched_on(config.get("callbacks"))]
    if not loggers:  # (~logger) Lightning refuses a LearningRateMonitor with nothing to log to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    always = [ValidateAtEnd(), ScoredExamples()]
    trainer = trainer_from(
        config["trainer"], logger=loggers, callbacks=[*callbacks, *always, *extra_callbacks]
    )
    trainer.callbacks = state_savers_last(trainer.callbacks)
    return trainer


def switched_on(nodes: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The nodes of a group of callbacks or loggers but those set to null, which is how a run
    leaves one out (callbacks.attention_maps=null)."""
    return [node for node in (nodes or {}).values() if node is not None]


def build_callback(node: dict[str, Any], sweep_job: bool) -> L.Callback:
    """A callback of the config; callbacks.latest's keep_when_done null is decided by the
    kind of run: a job of a -m sweep drops its training state when done, a single run not."""
    if "keep_when_done" in node and node["keep_when_done"] is None:
        return build({**node, "keep_when_done": not sweep_job}, MACHINERY)
    return build(node, MACHINERY)


def state_savers_last(callbacks: list[L.Callback]) -> list[L.Callback]:
    """`callbacks` with LatestCheckpoint last: at the end of an epoch Lightning calls early
    stopping and the checkpoint callbacks after the others, in list order, and last.ckpt
    must hold what the best checkpoint and early stopping made of that epoch."""
    return sorted(callbacks, key=lambda callback: isinstance(callback, LatestCheckpoint))


def trainer_from(node: dict[str, Any], **settings: Any) -> L.Trainer:
    """Lightning's Trainer of the trainer node, its nested nodes (plugins, a profiler) built
    first, and `settings` over it."""
    nested = {key: built(value) for key, value in node.items() if is_node(value)}
    rest = {key: value for key, value in node.items() if key not in nested}
    return build(rest, MACHINERY, **(nested | settings))


def is_node(value: Any) -> bool:
    """A node naming a class to build, or a list of them."""
    if isinstance(value, list):
        return bool(value) and all(is_node(item) for item in value)
    return isinstance(value, dict) and "_target_" in value


def built(value: Any) -> Any:
    return [built(item) for item in value] if isinstance(value, list) else build(value, MACHINERY)
