"""Lightning callbacks of our own: conf/callbacks/default.yaml lists the optional ones;
ValidateAtEnd and ScoredExamples are part of every trainer (`attnlab.runner.trainer.build_trainer`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from attnlab.errors import Diverged
from attnlab.flops import peak_flops
from attnlab.systems.base import System

log = logging.getLogger(__name__)


class FiniteLoss(L.Callback):
    """Stops a diverged run at its first non-finite loss, with an error that says so, rather
    than training on NaN (and keeping a NaN checkpoint as the best). Reading the loss waits
    for the GPU once a step: tens of microseconds against a step's milliseconds."""

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        # decided together, so that every DDP rank stops at the same step
        if not trainer.strategy.reduce_boolean_decision(bool(torch.isfinite(loss)), all=True):
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            # the step its metrics row carries: the optimizer has already stepped on it
            raise Diverged(
                f"train/loss is {float(loss)} at step {trainer.global_step - 1} (learning rate "
                f"{lr:.3g}): the run diverged; lower task.optim.lr, raise "
                "task.optim.warmup_steps, or keep trainer.gradient_clip_val on"
            )


class TokenThroughput(L.Callback):
    """Logs train/tokens_per_s: the tokens the network read in training steps (padding
    aside; System.batch_tokens) over the time those steps took (forward, backward, optimizer;
    not data loading or validation), since training began, on this device; and on a device
    whose peak is known, train/mfu (attnlab.flops) at the longest sequence the data gives.
    Lightning's ThroughputMonitor assumes every batch holds as many samples; ours hold a
    token budget."""

    def __init__(self) -> None:
        self.tokens, self.seconds, self.started = 0, 0.0, 0.0
        self.flops: float | None = None  # per token, over the device's peak per second

    def on_train_start(self, trainer: L.Trainer, module: System) -> None:
        self.tokens, self.seconds = 0, 0.0
        if module.device.type != "cuda":
            return  # no peak known: no MFU
        peak = peak_flops(torch.cuda.get_device_name(module.device))
        if peak is not None and trainer.datamodule is not None:
            self.flops = module.flops_per_token(trainer.datamodule.max_seq_len) / peak

    def on_train_batch_start(
        self, trainer: L.Trainer, module: L.LightningModule, batch: Any, index: int
    ) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, module: System, outputs: Any, batch: Any, index: int
    ) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)  # the step's kernels are queued, not done
        self.seconds += time.perf_counter() - self.started
        self.tokens += module.batch_tokens(batch)
        rate = self.tokens / self.seconds
        module.log("train/tokens_per_s", rate, on_step=True, on_epoch=False)
        if self.flops is not None:
            module.log("train/mfu", rate * self.flops, on_step=True, on_epoch=False)


class AttentionMaps(L.Callback):
    """At the end of training, draws the attention weights of every layer and head for one
    fixed validation example (the longest of the first batch) into <run dir>/<filename>,
    and logs the image to W&B when a W&B logger is on."""

    def __init__(self, filename: str) -> None:
        self.filename = filename

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, module: System) -> None:
        if trainer.fast_dev_run:
            return  # a dry run writes nothing
        batch = next(iter(trainer.datamodule.val_dataloader()))
        was_training = module.training
        module.eval()
        try:
            maps = module.attention_maps(batch)
        finally:
            module.train(was_training)
        from attnlab.plots import attention_figure, save  # matplotlib: only when it draws

        figure = attention_figure(
            {name: weights.float().cpu().numpy() for name, weights in maps.items()},
            f"attention weights of the final weights (step {trainer.global_step}): the "
            "longest example of the first validation batch",
        )
        path = save(figure, Path(trainer.default_root_dir) / self.filename)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image("attention", [str(path)], step=trainer.global_step)


class ValidateAtEnd(L.Callback):
    """Every run validates its final weights, so that a best checkpoint and validation
    metrics exist for every finished run. Lightning validates where an epoch (or
    val_check_interval) ends; a step budget (trainer.max_steps) that ends training inside an
    epoch, or a last epoch that check_val_every_n_epoch skips, would end without validating.
    Asking the loop to stop at the last step makes it validate before it stops."""

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        epochs = trainer.max_epochs  # -1 or None: no epoch budget, so no last epoch
        last_epoch = epochs is not None and 0 < epochs <= trainer.current_epoch + 1
        if last_epoch and trainer.check_val_every_n_epoch is not None:
            trainer.check_val_every_n_epoch = 1

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class ScoredExamples(L.Callback):
    """How many examples an evaluation scored, out of how many its split holds: logged as
    `<split>/examples` and `<split>/examples_total`, and said in the log. A partial score
    (trainer.limit_val_batches, limit_test_batches, fast_dev_run) is a warning, once per
    split and run, so that it is never mistaken for the whole split's."""

    def __init__(self) -> None:
        self.scored = 0
        self.warned: set[str] = set()

    def _start(self, *_: Any) -> None:
        self.scored = 0

    def _count(self, trainer: L.Trainer, module: System, outputs: Any, batch: Any, *_: Any) -> None:
        self.scored += module.batch_examples(batch)

    on_validation_epoch_start = on_test_epoch_start = _start
    on_validation_batch_end = on_test_batch_end = _count

    def on_validation_epoch_end(self, trainer: L.Trainer, module: System) -> None:
        if not trainer.sanity_checking:
            self._report(trainer, module, "val", trainer.val_dataloaders)

    def on_test_epoch_end(self, trainer: L.Trainer, module: System) -> None:
        self._report(trainer, module, "test", trainer.test_dataloaders)

    def _report(self, trainer: L.Trainer, module: System, split: str, loader: Any) -> None:
        scored = int(trainer.strategy.reduce(torch.tensor(float(self.scored)), reduce_op="sum"))
        total = len(loader.dataset)
        # the same on every rank (scored is reduced already): syncing changes nothing
        module.log(f"{split}/examples", float(scored), sync_dist=True, reduce_fx="max")
        module.log(f"{split}/examples_total", float(total), sync_dist=True, reduce_fx="max")
        fitting = trainer.state.fn == TrainerFn.FITTING
        if scored >= total:
            if not fitting:  # an evaluation says so; each validation of a fit need not
                log.info("%s: scored all %d examples", split, total)
            return
        if split in self.warned:
            return
        self.warned.add(split)
        limit = f"limit_{split}_batches"
        why = "fast_dev_run" if trainer.fast_dev_run else f"{limit}={getattr(trainer, limit)}"
        log.warning("%s: scored %d of %d examples (trainer.%s)", split, scored, total, why)


class ParameterSummary(ModelSummary):
    """Lightning's model summary as plain text, without its FLOPs column and total: they read
    0 unless a module declares `example_input_array`, which no attnlab system does."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        widths = [max([len(name), *(len(str(v)) for v in values)]) for name, values in columns]
        rows = [
            [name for name, _ in columns],
            *zip(*(values for _, values in columns), strict=True),
        ]
        lines = [
            " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        lines += [
            f"{get_human_readable_count(trainable_parameters):<10}trainable parameters",
            f"{get_human_readable_count(total_parameters):<10}parameters in all",
            f"{model_size:<10.2f}MB of parameters",
        ]
        log.info("\n%s", "\n".join(lines))
